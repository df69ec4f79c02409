#include "python/tensors/host_state_store.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>

#include "base/errors.hpp"
#include "python/tensors/offload_engines.hpp"

namespace stowage::torch_offload {

HostStateStore::HostStateStore(const c10::Device& device) {
  OffloadEngine* engine = engine_for(device);
  if (engine == nullptr) {
    STOWAGE_CHECK(device.is_cpu(), "stowage cannot offload optimizer states of ", device.str(),
                  " tensors (a CUDA device, or CPU mode's, is needed)");
    return;  // a plain CPU device: ordinary tensors
  }
  pool_ = &engine->pool();
}

at::Tensor HostStateStore::empty(std::int64_t numel, at::ScalarType dtype) {
  STOWAGE_CHECK(numel >= 0, "a host state of ", numel, " elements");
  return tensor_over(allocate(static_cast<std::size_t>(numel) * c10::elementSize(dtype)), numel, dtype);
}

std::shared_ptr<void> HostStateStore::allocate(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (pool_ == nullptr) {  // torch's CPU allocator, as at::empty
    auto data = std::make_shared<c10::DataPtr>(c10::GetCPUAllocator()->allocate(bytes));
    return {data, data->get()};
  }
  void* ptr = pool_->allocate_resident(bytes);
  const auto size = static_cast<std::int64_t>(pool_->resident_block_size(ptr));
  *held_ += size;
  PinnedHostPool* pool = pool_;
  std::shared_ptr<std::atomic<std::int64_t>> held = held_;
  return {ptr, [pool, held, size](void* p) {
            *held -= size;
            pool->free_resident(p);
          }};
}

at::Tensor HostStateStore::tensor_over(const std::shared_ptr<void>& block, std::int64_t numel, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  return at::from_blob(block.get(), {numel}, [block](void*) {}, options);
}

PinnedHostPoolStats HostStateStore::stats() const {
  if (pool_ == nullptr) return {};
  PinnedHostPoolStats out = pool_->stats();
  out.allocated_bytes = allocated_bytes();
  out.reserved_bytes = out.resident_reserved_bytes;
  return out;
}

std::string HostStateStore::placement() const {
  return pool_ != nullptr ? pool_->placement() : std::string("ordinary CPU memory");
}

}  // namespace stowage::torch_offload
