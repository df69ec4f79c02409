#include "python/tensors/tensor_offloader.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "python/tensors/check_mode.hpp"
#include "python/tensors/content_checksum.hpp"
#include "python/tensors/offload_engines.hpp"

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
  if (std::shared_ptr<SavedStorage> saved = shared_saved(tensor)) {
    ++counts_.num_shared;
    PackedTensor packed = view_of(tensor, std::move(saved));
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
  auto saved = std::make_shared<SavedStorage>(storage);
  DeviceBuffer buffer{const_cast<void*>(storage.data()), storage.nbytes(), saved->owner_for_copy(storage)};
  const std::optional<Offloader::OffloadId> id = engine->offloader().offload(std::move(buffer), *compute);
  if (!id.has_value()) {
    count(storage, Kept::kHostFull);
    return kept(tensor);
  }
  saved->set_ref(std::make_shared<OffloadRef>(*engine, *id));
  offloaded_.insert_or_assign(key, Offloaded{saved, storage.nbytes(), version_of(tensor)});
  count(storage, std::nullopt);
  PackedTensor packed = view_of(tensor, std::move(saved));
  packed.check = std::move(check);
  return packed;
}

std::shared_ptr<SavedStorage> TensorOffloader::shared_saved(const at::Tensor& tensor) {
  const auto it = offloaded_.find(tensor.storage().unsafeGetStorageImpl());
  if (it == offloaded_.end()) return nullptr;
  std::shared_ptr<SavedStorage> saved = it->second.saved.lock();
  // A storage whose saved tensors are all gone, one that died (its address reused), or bytes
  // changed in place since: offload it afresh.
  if (saved == nullptr || !saved->alive() || it->second.version != version_of(tensor)) {
    offloaded_.erase(it);
    return nullptr;
  }
  return saved;
}

void TensorOffloader::for_each_alive(const std::function<void(SavedStorage&)>& fn) {
  std::vector<Offloader*> polled;
  for (auto it = offloaded_.begin(); it != offloaded_.end();) {
    const std::shared_ptr<SavedStorage> saved = it->second.saved.lock();
    if (saved == nullptr || !saved->alive()) {
      it = offloaded_.erase(it);
      continue;
    }
    // Device buffers whose copies completed are let go first, so that the references counted
    // are the holders' own.
    if (const std::shared_ptr<OffloadRef> ref = saved->ref()) {
      Offloader& offloader = ref->engine().offloader();
      if (std::find(polled.begin(), polled.end(), &offloader) == polled.end()) {
        offloader.poll();
        polled.push_back(&offloader);
      }
    }
    fn(*saved);
    ++it;
  }
}

void TensorOffloader::region_ended() {
  for_each_alive([&](SavedStorage& saved) {
    counts_.held_elsewhere += static_cast<std::int64_t>(saved.keep_if_held_elsewhere());
  });
}

void TensorOffloader::forward_ended() {
  if (check_mode()) for_each_alive([](SavedStorage& saved) { saved.watch_if_held_elsewhere(); });
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
    const std::shared_ptr<SavedStorage> saved = offloaded.saved.lock();
    if (saved != nullptr && saved->alive()) bytes += static_cast<std::int64_t>(offloaded.bytes);
  }
  return bytes;
}

PackedTensor TensorOffloader::view_of(const at::Tensor& tensor, std::shared_ptr<SavedStorage> saved) {
  PackedTensor packed;
  packed.version = SavedVersion(tensor);
  packed.saved = std::move(saved);
  packed.sizes = tensor.sizes().vec();
  packed.strides = tensor.strides().vec();
  packed.storage_offset = tensor.storage_offset();
  packed.dtype = tensor.scalar_type();
  packed.device = tensor.device();
  return packed;
}

at::Tensor TensorOffloader::view_over(const c10::Storage& storage, const PackedTensor& packed) {
  at::Tensor out = at::empty({0}, at::TensorOptions().dtype(packed.dtype).device(packed.device));
  out.set_(storage, packed.storage_offset, packed.sizes, packed.strides);
  return out;
}

at::Tensor TensorOffloader::unpack(const PackedTensor& packed) {
  packed.version.check();
  // Still alive, or kept as the region ended: the bytes as they are now, as torch reads its own
  // saved tensor (Note [Saved tensors written through an alias]); no copy came into it to verify.
  // Copies completed by now let go of their device buffers first, so that a storage only the
  // offloader held comes back from its copy whatever the copy threads' timing.
  if (const std::shared_ptr<OffloadRef> copy = packed.saved->ref()) copy->engine().offloader().poll();
  SavedStorage::Reading reading = packed.saved->read();
  if (reading.in_place.has_value()) {
    if (reading.copy_dropped != nullptr) {
      reading.copy_dropped->engine().offloader().note_used_in_place(reading.copy_dropped->id());
    }
    return view_over(*reading.in_place, packed);
  }
  if (reading.let_go.has_value() && packed.check != nullptr) verify_unwritten(packed, *reading.let_go);
  const std::shared_ptr<OffloadRef> ref = packed.saved->ref();  // set: only a kept storage lets go of it
  OffloadEngine& engine = ref->engine();
  const std::unique_ptr<ComputeTimeline> compute = current_timeline(packed.device, engine);
  const DeviceBuffer buffer = engine.offloader().reload(ref->id(), *compute);
  const auto storage = std::static_pointer_cast<c10::Storage>(buffer.owner);
  at::Tensor out = view_over(*storage, packed);
  if (packed.check != nullptr) verify(packed, *storage);
  return out;
}

namespace {

std::string hex(const at::Tensor& sums) {
  std::ostringstream text;
  const at::Tensor values = sums.cpu().reshape(-1);
  for (std::int64_t i = 0; i < values.numel(); ++i) {
    text << (i ? " " : "") << std::hex << static_cast<std::uint64_t>(values[i].item<std::int64_t>());
  }
  return text.str();
}

// "[torch.FloatTensor [64, 512]] saved in module '2' at step 3"
std::string saved_tensor(const PackedTensor& packed) {
  const std::string& where = packed.check->where;
  std::ostringstream text;
  text << "[torch." << c10::toString(packed.dtype) << "Tensor " << c10::IntArrayRef(packed.sizes) << "] saved "
       << (where.empty() ? std::string("outside any module") : "in module '" + where + "'") << " at step "
       << packed.check->step;
  return text.str();
}

}  // namespace

void TensorOffloader::verify(const PackedTensor& packed, const c10::Storage& storage) {
  const at::Tensor now = content_checksums({storage_bytes(storage, packed.device)});
  if (now.equal(packed.check->checksum)) return;
  TORCH_CHECK(false, "stowage check: an offloaded tensor came back changed: ", saved_tensor(packed), " (",
              storage.nbytes(), " bytes; checksum ", hex(packed.check->checksum), " as it was saved, ", hex(now),
              " as it came back). Its bytes changed between being saved and being copied to host memory, or on "
              "the way: it was written through .data or another alias that does not bump its version while its "
              "copy ran (and let go of before the model's forward returned), or the copy was corrupted (the host "
              "memory, the link or the copy engine); stowage stopped before backward used it.");
}

void TensorOffloader::verify_unwritten(const PackedTensor& packed, const c10::Storage& storage) {
  const at::Tensor now = content_checksums({storage_bytes(storage, packed.device)});
  if (now.equal(packed.check->checksum)) return;
  TORCH_CHECK(false, "stowage check: a saved tensor was written after it was saved: ", saved_tensor(packed), " (",
              storage.nbytes(), " bytes; checksum ", hex(packed.check->checksum), " as it was saved, ", hex(now),
              " as its last reference let go of it) was written through .data or another alias that does not "
              "bump its version after it was saved, and let go of before backward read it. torch's own saved "
              "tensor would keep it and backward would read the written bytes; stowage's copy holds those it "
              "was saved with. Keep the reference until backward has run (stowage then reads the tensor in "
              "place, as torch does), or write a clone instead; stowage stopped before backward used it.");
}

}  // namespace stowage::torch_offload
