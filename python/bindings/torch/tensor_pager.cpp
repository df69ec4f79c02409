#include "python/bindings/torch/tensor_pager.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>

#include <utility>

#include "python/bindings/torch/offload_engines.hpp"

namespace stowage::torch_offload {

namespace {

std::uint32_t version_of(const at::Tensor& tensor) {
  const c10::VariableVersion& version = tensor.unsafeGetTensorImpl()->version_counter();
  return version.enabled() ? version.current_version() : 0;
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

std::variant<KeptTensor, PackedTensor> TensorPager::pack(const at::Tensor& tensor) {
  ++counts_.num_saved;
  if (!tensor.defined() || !tensor.has_storage()) return kept(tensor);
  const c10::Storage& storage = tensor.storage();
  const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  if (std::shared_ptr<PageRef> page = shared_page(tensor)) {
    ++counts_.num_shared;
    return view_of(tensor, std::move(page));
  }
  if (storage.nbytes() < min_bytes_ || storage.nbytes() == 0) {
    count(storage, Kept::kSmall);
    return kept(tensor);
  }
  if (parameters_.contains(tensor) || derived_from_parameter(tensor)) {
    count(storage, Kept::kParameter);
    return kept(tensor);
  }
  OffloadEngine* engine = pageable(tensor.device(), storage.data()) ? engine_for(tensor.device())
                                                                     : nullptr;
  if (engine == nullptr) {
    count(storage, Kept::kElsewhere);
    return kept(tensor);
  }
  const std::unique_ptr<ComputeTimeline> compute = current_timeline(tensor.device(), *engine);
  DeviceBuffer buffer{const_cast<void*>(storage.data()), storage.nbytes(),
                      std::make_shared<c10::Storage>(storage)};
  const std::optional<Pager::PageId> id = engine->pager().page_out(std::move(buffer), *compute);
  if (!id.has_value()) {
    count(storage, Kept::kHostFull);
    return kept(tensor);
  }
  auto page = std::make_shared<PageRef>(*engine, *id);
  paged_.insert_or_assign(key, Paged{storage.getWeakStorageImpl(), page, version_of(tensor)});
  count(storage, std::nullopt);
  return view_of(tensor, std::move(page));
}

std::shared_ptr<PageRef> TensorPager::shared_page(const at::Tensor& tensor) {
  const auto it = paged_.find(tensor.storage().unsafeGetStorageImpl());
  if (it == paged_.end()) return nullptr;
  std::shared_ptr<PageRef> page = it->second.page.lock();
  // A page whose tensors are all gone, a storage that died (its address reused), or bytes
  // changed in place since: page it afresh.
  if (page == nullptr || it->second.storage.expired() ||
      it->second.version != version_of(tensor)) {
    paged_.erase(it);
    return nullptr;
  }
  return page;
}

void TensorPager::count(const c10::Storage& storage, std::optional<Kept> kept) {
  const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  const auto it = counted_.find(key);
  if (it != counted_.end() && !it->second.expired()) return;
  counted_.insert_or_assign(key, storage.getWeakStorageImpl());
  const auto bytes = static_cast<std::int64_t>(storage.nbytes());
  counts_.seen += bytes;
  if (!kept.has_value()) {
    counts_.paged += bytes;
    return;
  }
  switch (*kept) {
    case Kept::kParameter: counts_.parameters += bytes; break;
    case Kept::kSmall: counts_.small += bytes; break;
    case Kept::kElsewhere: counts_.elsewhere += bytes; break;
    case Kept::kHostFull: counts_.host_full += bytes; break;
  }
}

std::int64_t TensorPager::live_paged_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& [key, paged] : paged_) {
    const c10::intrusive_ptr<c10::StorageImpl> storage = paged.storage.lock();
    if (storage) bytes += static_cast<std::int64_t>(storage->nbytes());
  }
  return bytes;
}

PackedTensor TensorPager::view_of(const at::Tensor& tensor, std::shared_ptr<PageRef> page) {
  PackedTensor packed;
  packed.version = SavedVersion(tensor);
  packed.page = std::move(page);
  packed.sizes = tensor.sizes().vec();
  packed.strides = tensor.strides().vec();
  packed.storage_offset = tensor.storage_offset();
  packed.dtype = tensor.scalar_type();
  packed.device = tensor.device();
  return packed;
}

at::Tensor TensorPager::unpack(const PackedTensor& packed) {
  packed.version.check();
  OffloadEngine& engine = packed.page->engine();
  const std::unique_ptr<ComputeTimeline> compute = current_timeline(packed.device, engine);
  const DeviceBuffer buffer = engine.pager().page_in(packed.page->id(), *compute);
  const auto storage = std::static_pointer_cast<c10::Storage>(buffer.owner);
  at::Tensor out = at::empty({0}, at::TensorOptions().dtype(packed.dtype).device(packed.device));
  out.set_(*storage, packed.storage_offset, packed.sizes, packed.strides);
  return out;
}

}  // namespace stowage::torch_offload
