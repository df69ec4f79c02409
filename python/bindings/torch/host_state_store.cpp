#include "python/bindings/torch/host_state_store.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "allocator/base/errors.hpp"
#include "python/bindings/torch/offload_engines.hpp"

namespace stowage::torch_offload {

namespace {

PinnedHostPoolOptions pool_options(DeviceBackend& backend, std::size_t limit_bytes) {
  PinnedHostPoolOptions options;
  options.limit_bytes = limit_bytes;
  options.pci_bus_id = backend.properties().pci_bus_id;
  return options;
}

}  // namespace

HostStateStore::HostStateStore(const c10::Device& device, std::size_t limit_bytes) {
  OffloadEngine* engine = engine_for(device);
  if (engine == nullptr) {
    STOWAGE_CHECK(device.is_cpu(), "stowage cannot offload optimizer states of ", device.str(),
                  " tensors (a CUDA device, or CPU mode's, is needed)");
    return;  // a plain CPU device: ordinary tensors
  }
  DeviceBackend& backend = engine->backend();
  pool_ = std::make_shared<PinnedHostPool>(backend, pool_options(backend, limit_bytes));
}

at::Tensor HostStateStore::empty(std::int64_t numel, at::ScalarType dtype) {
  STOWAGE_CHECK(numel >= 0, "a host state of ", numel, " elements");
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  if (pool_ == nullptr) return at::empty({numel}, options);
  const std::size_t bytes = static_cast<std::size_t>(numel) * c10::elementSize(dtype);
  void* data = pool_->allocate(bytes == 0 ? 1 : bytes, Stream{});
  std::shared_ptr<PinnedHostPool> pool = pool_;
  return at::from_blob(data, {numel}, [pool](void* ptr) { pool->free(ptr); }, options);
}

PinnedHostPoolStats HostStateStore::stats() const {
  return pool_ != nullptr ? pool_->stats() : PinnedHostPoolStats{};
}

std::string HostStateStore::placement() const {
  return pool_ != nullptr ? pool_->placement() : std::string("ordinary CPU memory");
}

}  // namespace stowage::torch_offload
