// TensorOffloader: saved tensors into the offload engine and back, for one offload region
// (stowage.offload.activations()).
//
// pack() decides, per saved tensor, whether it is offloaded: not when its storage is smaller than
// min_bytes, is a parameter's (Note [Parameters are not offloaded]), or is memory stowage does not
// offload (a CPU tensor outside CPU mode); not when the host has no memory for it (it stays, so
// nothing is lost). Otherwise the whole storage is offloaded, once: a view's base and a tensor
// saved twice share one buffer while the storage is unchanged (the version counter says so), and
// unpack() rebuilds each saved view over the storage that comes back.
//
// Every saved tensor, offloaded or kept, carries its SavedVersion: unpacking one changed in place
// since it was saved raises torch's own error, as torch would without the hooks. In check mode
// (check_mode.hpp) an offloaded tensor also carries a checksum of its storage's bytes taken on the
// device as it leaves; the bytes that come back are compared before backward uses them.
//
// Contract: one region on one thread packs; unpacks run on autograd's threads. A PackedTensor
// holds its buffer; the last one to go drops it (a graph freed unused leaves nothing behind).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "offload/offload_engine.hpp"
#include "python/bindings/torch/parameter_storages.hpp"
#include "python/bindings/torch/saved_version.hpp"

namespace stowage::torch_offload {

// A buffer and the engine holding it; dropped when the last saved tensor on it goes.
class OffloadRef {
 public:
  OffloadRef(OffloadEngine& engine, Offloader::OffloadId id) : engine_(engine), id_(id) {}
  ~OffloadRef() { engine_.offloader().drop(id_); }
  OffloadRef(const OffloadRef&) = delete;
  OffloadRef& operator=(const OffloadRef&) = delete;

  OffloadEngine& engine() const noexcept { return engine_; }
  Offloader::OffloadId id() const noexcept { return id_; }

 private:
  OffloadEngine& engine_;
  Offloader::OffloadId id_;
};

// A saved tensor that stays on the device: detached (see tensor_offloader.cpp, kept()), with the
// version it was saved at.
struct KeptTensor {
  at::Tensor tensor;
  SavedVersion version;

  // The saved tensor (detached, a view of the original's storage) for autograd; raises torch's
  // error when it was changed in place since it was saved.
  at::Tensor unpack() const;
  // `tensor` as a saved-tensor hook keeps it.
  static KeptTensor of(const at::Tensor& tensor);
};

// Check mode's record of an offloaded storage: its checksum as it left, and what to name it by.
struct OffloadCheck {
  at::Tensor checksum;  // content_checksums() of the storage's bytes, on the device
  std::string where;    // the module that saved it
  std::int64_t step = 0;
};

// A saved tensor in the offload engine: its offloaded buffer and the view over its storage.
struct PackedTensor {
  SavedVersion version;
  std::shared_ptr<OffloadCheck> check;  // check mode only
  std::shared_ptr<OffloadRef> ref;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::int64_t storage_offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

// What the region's pack calls saw, each storage counted once, in bytes.
struct PackCounts {
  std::int64_t seen = 0;        // every storage saved
  std::int64_t offloaded = 0;   // offloaded
  std::int64_t parameters = 0;  // kept: a parameter's (Note [Parameters are not offloaded])
  std::int64_t small = 0;       // kept: under min_bytes
  std::int64_t elsewhere = 0;   // kept: memory stowage does not offload
  std::int64_t host_full = 0;   // kept: no host memory left
  std::int64_t num_saved = 0;   // pack calls
  std::int64_t num_shared = 0;  // of them, tensors whose storage was offloaded already
};

class TensorOffloader {
 public:
  explicit TensorOffloader(std::size_t min_bytes) : min_bytes_(min_bytes) {}

  // The tensor itself when it stays on the device, else its offloaded buffer. `where` names the module that
  // saved it, for check mode's message.
  std::variant<KeptTensor, PackedTensor> pack(const at::Tensor& tensor, const std::string& where = "");
  // The saved tensor back on its device, usable by the compute that follows; raises torch's
  // error (before any copy) when it was changed in place since it was saved.
  static at::Tensor unpack(const PackedTensor& packed);
  // Never offloads this storage (a parameter or a buffer).
  void add_parameter(const at::Tensor& tensor) { parameters_.add(tensor); }
  const PackCounts& counts() const noexcept { return counts_; }
  // Bytes of the offloaded storages still alive: held by their copy, or by someone else too.
  std::int64_t live_offloaded_bytes() const;

 private:
  enum class Kept : std::uint8_t { kParameter, kSmall, kElsewhere, kHostFull };
  struct Offloaded {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    std::weak_ptr<OffloadRef> ref;
    std::uint32_t version = 0;
  };

  // Counts the storage once, under `kept` or as offloaded (nullopt).
  void count(const c10::Storage& storage, std::optional<Kept> kept);
  // The offloaded buffer already holding this storage at this version, if any.
  std::shared_ptr<OffloadRef> shared_ref(const at::Tensor& tensor);
  static PackedTensor view_of(const at::Tensor& tensor, std::shared_ptr<OffloadRef> ref);
  // Check mode: raises when the storage that came back is not the one that left.
  static void verify(const PackedTensor& packed, const c10::Storage& storage);

  const std::size_t min_bytes_;
  ParameterStorages parameters_;
  std::unordered_map<const c10::StorageImpl*, Offloaded> offloaded_;
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> counted_;
  PackCounts counts_;
};

}  // namespace stowage::torch_offload
