// TensorOffloader: saved tensors into the offload engine and back, for one offload region
// (stowage.offload.activations()).
//
// pack() decides, per saved tensor, whether it is offloaded: not when its storage is smaller than
// min_bytes, is a parameter's (Note [Parameters are not offloaded]), or is memory stowage does not
// offload (a CPU tensor outside CPU mode); not when the host has no memory for it (it stays, so
// nothing is lost). Otherwise the whole storage is offloaded, once: a view's base and a tensor
// saved twice share one SavedStorage while the storage is unchanged (the version counter says
// so), and unpack() rebuilds each saved view over the storage: in place where it is still alive
// or kept, else as it comes back (Note [Saved tensors written through an alias] in
// saved_storage.hpp: forward_ended() keeps the storages someone else still holds).
//
// Every saved tensor, offloaded or kept, carries its SavedVersion: unpacking one changed in place
// since it was saved raises torch's own error, as torch would without the hooks. In check mode
// (check_mode.hpp) an offloaded tensor also carries a checksum of its storage's bytes taken on the
// device as it leaves; bytes that come back from host memory are compared before backward uses
// them.
//
// Contract: one region on one thread packs; unpacks run on autograd's threads. A PackedTensor
// holds its buffer; the last one to go drops it (a graph freed unused leaves nothing behind).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "offload/offload_engine.hpp"
#include "python/tensors/parameter_storages.hpp"
#include "python/tensors/saved_storage.hpp"
#include "python/tensors/saved_version.hpp"

namespace stowage::torch_offload {

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

// A saved tensor in the offload engine: its offloaded storage and the view over it.
struct PackedTensor {
  SavedVersion version;
  std::shared_ptr<OffloadCheck> check;  // check mode only
  std::shared_ptr<SavedStorage> saved;
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
  std::int64_t held_elsewhere = 0;  // of the offloaded, kept as the region ended: held by someone else
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
  // The region ended: keeps on the device the offloaded storages someone besides the offloader
  // still holds, so that backward reads them in place (Note [Saved tensors written through an
  // alias]).
  void region_ended();
  // The model's forward returned: in check mode, watches the offloaded storages someone besides
  // the offloader holds, for unpack to tell a write through an alias from a corrupted copy.
  void forward_ended();
  // Never offloads this storage (a parameter or a buffer).
  void add_parameter(const at::Tensor& tensor) { parameters_.add(tensor); }
  const PackCounts& counts() const noexcept { return counts_; }
  // Bytes of the offloaded storages still alive: held by their copy, or by someone else too.
  std::int64_t live_offloaded_bytes() const;

 private:
  enum class Kept : std::uint8_t { kParameter, kSmall, kElsewhere, kHostFull };
  struct Offloaded {
    std::weak_ptr<SavedStorage> saved;
    std::size_t bytes = 0;
    std::uint32_t version = 0;
  };

  // Counts the storage once, under `kept` or as offloaded (nullopt).
  void count(const c10::Storage& storage, std::optional<Kept> kept);
  // The SavedStorage already holding this storage at this version, if any.
  std::shared_ptr<SavedStorage> shared_saved(const at::Tensor& tensor);
  static PackedTensor view_of(const at::Tensor& tensor, std::shared_ptr<SavedStorage> saved);
  static at::Tensor view_over(const c10::Storage& storage, const PackedTensor& packed);
  // Calls fn for each offloaded storage still alive, after polling the offloaders.
  void for_each_alive(const std::function<void(SavedStorage&)>& fn);
  // Check mode: raises when the storage that came back is not the one that left.
  static void verify(const PackedTensor& packed, const c10::Storage& storage);
  // Check mode: raises when a watched storage let go of before backward was written since saved.
  static void verify_unwritten(const PackedTensor& packed, const c10::Storage& storage);

  const std::size_t min_bytes_;
  ParameterStorages parameters_;
  std::unordered_map<const c10::StorageImpl*, Offloaded> offloaded_;
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> counted_;
  PackCounts counts_;
};

}  // namespace stowage::torch_offload
