#include "python/bindings/torch/tensor_offloader.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>

#include <sstream>
#include <utility>

#include "python/bindings/torch/check_mode.hpp"
#include "python/bindings/torch/content_checksum.hpp"
#include "python/bindings/torch/offload_engines.hpp"

namespace stowage::torch_offload {

namespace {

std::uint32_t version_of(const at::Tensor& tensor) {
  const c10::VariableVersion& version = tensor.unsafeGetTensorImpl()->version_counter();
  return version.enabled() ? version.current_version() : 0;
}

// The storage's bytes, as one flat tensor of bytes on its device.
at::Tensor storage_bytes(const c10::Storage& storage, const c10::Device& device) {
  at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device));
  bytes.set_(storage, 0, {static_cast<std::int64_t>(storage.nbytes())}, {1});
  return bytes;
}

std::shared_ptr<OffloadCheck> check_of(const c10::Storage& storage, const c10::Device& device, const std::string& where) {
  if (!check_mode()) return nullptr;
  return std::make_shared<OffloadCheck>(
      OffloadCheck{content_checksums({storage_bytes(storage, device)}), where, steps_ended()});
}

// A saved tensor kept on the device, as a saved-tensor hook returns it: detached. Kept whole, an
// op's saved output refers to the op's own node through its grad_fn, a cycle through autograd
// that no collector sees: a step that fails before its backward would leave its graph allocated.
// Unpacking gives autograd the same storage either way.
KeptTensor kept(const at::Tensor& tensor) { return KeptTensor::of(tensor); }

}  // namespace

KeptTensor KeptTensor::of(const at::Tensor& tensor) {
  return {tensor.defined() ? tensor.detach() : tensor, SavedVersion(tensor)};
}

at::Tensor KeptTensor::unpack() const {
  version.check();
  return tensor;
}

std::variant<KeptTensor, PackedTensor> TensorOffloader::pack(const at::Tensor& tensor, const std::string& where) {
  ++counts_.num_saved;
  if (!tensor.defined() || !tensor.has_storage()) return kept(tensor);
  const c10::Storage& storage = tensor.storage();
  const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  if (std::shared_ptr<OffloadRef> ref = shared_ref(tensor)) {
    ++counts_.num_shared;
    PackedTensor packed = view_of(tensor, std::move(ref));
    packed.check = check_of(storage, tensor.device(), where);
    return packed;
  }
  if (storage.nbytes() < min_bytes_ || storage.nbytes() == 0) {
    count(storage, Kept::kSmall);
    return kept(tensor);
  }
  if (parameters_.contains(tensor) || derived_from_parameter(tensor)) {
    count(storage, Kept::kParameter);
    return kept(tensor);
  }
  OffloadEngine* engine = offloadable(tensor.device(), storage.data()) ? engine_for(tensor.device())
                                                                     : nullptr;
  if (engine == nullptr) {
    count(storage, Kept::kElsewhere);
    return kept(tensor);
  }
  std::shared_ptr<OffloadCheck> check = check_of(storage, tensor.device(), where);  // before the copy out
  const std::unique_ptr<ComputeTimeline> compute = current_timeline(tensor.device(), *engine);
  DeviceBuffer buffer{const_cast<void*>(storage.data()), storage.nbytes(),
                      std::make_shared<c10::Storage>(storage)};
  const std::optional<Offloader::OffloadId> id = engine->offloader().offload(std::move(buffer), *compute);
  if (!id.has_value()) {
    count(storage, Kept::kHostFull);
    return kept(tensor);
  }
  auto ref = std::make_shared<OffloadRef>(*engine, *id);
  offloaded_.insert_or_assign(key, Offloaded{storage.getWeakStorageImpl(), ref, version_of(tensor)});
  count(storage, std::nullopt);
  PackedTensor packed = view_of(tensor, std::move(ref));
  packed.check = std::move(check);
  return packed;
}

std::shared_ptr<OffloadRef> TensorOffloader::shared_ref(const at::Tensor& tensor) {
  const auto it = offloaded_.find(tensor.storage().unsafeGetStorageImpl());
  if (it == offloaded_.end()) return nullptr;
  std::shared_ptr<OffloadRef> ref = it->second.ref.lock();
  // A buffer whose tensors are all gone, a storage that died (its address reused), or bytes
  // changed in place since: offload it afresh.
  if (ref == nullptr || it->second.storage.expired() ||
      it->second.version != version_of(tensor)) {
    offloaded_.erase(it);
    return nullptr;
  }
  return ref;
}

void TensorOffloader::count(const c10::Storage& storage, std::optional<Kept> kept) {
  const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  const auto it = counted_.find(key);
  if (it != counted_.end() && !it->second.expired()) return;
  counted_.insert_or_assign(key, storage.getWeakStorageImpl());
  const auto bytes = static_cast<std::int64_t>(storage.nbytes());
  counts_.seen += bytes;
  if (!kept.has_value()) {
    counts_.offloaded += bytes;
    return;
  }
  switch (*kept) {
    case Kept::kParameter: counts_.parameters += bytes; break;
    case Kept::kSmall: counts_.small += bytes; break;
    case Kept::kElsewhere: counts_.elsewhere += bytes; break;
    case Kept::kHostFull: counts_.host_full += bytes; break;
  }
}

std::int64_t TensorOffloader::live_offloaded_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& [key, offloaded] : offloaded_) {
    const c10::intrusive_ptr<c10::StorageImpl> storage = offloaded.storage.lock();
    if (storage) bytes += static_cast<std::int64_t>(storage->nbytes());
  }
  return bytes;
}

PackedTensor TensorOffloader::view_of(const at::Tensor& tensor, std::shared_ptr<OffloadRef> ref) {
  PackedTensor packed;
  packed.version = SavedVersion(tensor);
  packed.ref = std::move(ref);
  packed.sizes = tensor.sizes().vec();
  packed.strides = tensor.strides().vec();
  packed.storage_offset = tensor.storage_offset();
  packed.dtype = tensor.scalar_type();
  packed.device = tensor.device();
  return packed;
}

at::Tensor TensorOffloader::unpack(const PackedTensor& packed) {
  packed.version.check();
  OffloadEngine& engine = packed.ref->engine();
  const std::unique_ptr<ComputeTimeline> compute = current_timeline(packed.device, engine);
  const DeviceBuffer buffer = engine.offloader().reload(packed.ref->id(), *compute);
  const auto storage = std::static_pointer_cast<c10::Storage>(buffer.owner);
  at::Tensor out = at::empty({0}, at::TensorOptions().dtype(packed.dtype).device(packed.device));
  out.set_(*storage, packed.storage_offset, packed.sizes, packed.strides);
  if (packed.check != nullptr) verify(packed, *storage);
  return out;
}

void TensorOffloader::verify(const PackedTensor& packed, const c10::Storage& storage) {
  const at::Tensor now = content_checksums({storage_bytes(storage, packed.device)});
  if (now.equal(packed.check->checksum)) return;
  const auto hex = [](const at::Tensor& sums) {
    std::ostringstream text;
    const at::Tensor values = sums.cpu().reshape(-1);
    for (std::int64_t i = 0; i < values.numel(); ++i) {
      text << (i ? " " : "") << std::hex << static_cast<std::uint64_t>(values[i].item<std::int64_t>());
    }
    return text.str();
  };
  const std::string& where = packed.check->where;
  TORCH_CHECK(false, "stowage check: an offloaded tensor came back changed: [torch.", c10::toString(packed.dtype),
              "Tensor ", c10::IntArrayRef(packed.sizes), "] saved ",
              where.empty() ? std::string("outside any module") : "in module '" + where + "'", " at step ",
              packed.check->step, " (", storage.nbytes(), " bytes; checksum ", hex(packed.check->checksum),
              " as it left, ", hex(now), " as it came back). Its copy through host memory was corrupted (the "
              "host memory, the link or the copy engine); stowage stopped before backward used it.");
}

}  // namespace stowage::torch_offload
