// WeakStorage: a tensor's storage, referred to without keeping it alive (for a plan's recompute
// watch, python/stowage/plan/recompute_modes.py: the storages a checkpointed block made and still
// alive after it, whoever holds them).
//
// Contract: bytes() from any thread; the storage it gives is a strong reference while it lives.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <optional>

namespace stowage::torch_offload {

class WeakStorage {
 public:
  explicit WeakStorage(const at::Tensor& tensor)
      : weak_(tensor.storage().getWeakStorageImpl()), device_(tensor.device()) {}

  bool alive() const { return !weak_.expired(); }
  // Whether `tensor` is over this storage (the same storage object: resizing it, as FSDP does
  // between forward and backward, keeps it; `.data = other` gives the tensor another). Exact: the
  // weak reference keeps the object's address from being reused.
  bool is_storage_of(const at::Tensor& tensor) const {
    return tensor.has_storage() && tensor.storage().unsafeGetStorageImpl() == weak_._unsafe_get_target();
  }
  // The whole storage as a flat tensor of bytes on its device, where it is still alive.
  std::optional<at::Tensor> bytes() const {
    c10::intrusive_ptr<c10::StorageImpl> alive = weak_.lock();
    if (!alive) return std::nullopt;
    const c10::Storage storage(std::move(alive));
    at::Tensor out = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device_));
    out.set_(storage, 0, {static_cast<std::int64_t>(storage.nbytes())}, {1});
    return out;
  }

 private:
  c10::weak_intrusive_ptr<c10::StorageImpl> weak_;
  c10::Device device_;
};

}  // namespace stowage::torch_offload
