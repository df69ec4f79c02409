#include "python/tensors/offload_engines.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>

#include <map>
#include <mutex>

#include "base/errors.hpp"
#include "python/tensors/cpu_allocator.hpp"

#ifdef STOWAGE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "allocator/process/cuda_allocators.hpp"
#include "device/cuda/cuda_backend.hpp"
#include "python/libtorch/cuda_allocator.hpp"
#endif

namespace stowage::torch_offload {

namespace {

constexpr int kCpu = -1;

struct Registry {
  std::mutex mutex;
  std::map<int, OffloadEngine*> engines;  // never destroyed (see the header)
};

Registry& registry() {
  static auto* instance = new Registry();
  return *instance;
}

// A storage of `bytes` from torch's allocator for the device, as the offloader's device buffer.
DeviceBuffer storage_buffer(c10::Allocator* allocator, std::size_t bytes) {
  auto storage = std::make_shared<c10::Storage>(c10::Storage::use_byte_size_t(), bytes, allocator,
                                                /*resizable=*/false);
  void* data = storage->mutable_data();
  return {data, bytes, std::move(storage)};
}

OffloadEngine* make_cpu_engine() {
  HostBackend* backend = torch_cpu::backend();
  CachingAllocator* allocator = torch_cpu::allocator();
  if (backend == nullptr || allocator == nullptr) return nullptr;
  return new OffloadEngine(
      *backend, allocator,
      [](std::size_t bytes, Stream) { return storage_buffer(c10::GetCPUAllocator(), bytes); },
      [allocator] { return allocator->largest_available_block(); }, OffloadEngineOptions{});
}

#ifdef STOWAGE_TORCH_CUDA
OffloadEngine* make_cuda_engine(int index) {
  CachingAllocator* allocator = nullptr;
  DeviceBackend* backend = nullptr;
  if (torch_cuda::is_enabled()) {
    allocator = &cuda_allocators::get(index);
    backend = &allocator->backend();
  } else {
    backend = open_cuda_device(index).release();  // lives as long as the engine: forever
  }
  OffloadEngineOptions options;
  options.pool.pci_bus_id = backend->properties().pci_bus_id;
  return new OffloadEngine(
      *backend, allocator,
      [index](std::size_t bytes, Stream) {
        const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
        return storage_buffer(c10::cuda::CUDACachingAllocator::get(), bytes);
      },
      [allocator, backend]() -> std::size_t {
        return allocator != nullptr ? allocator->largest_available_block()
                                    : backend->memory_info().free_bytes;
      },
      options);
}
#endif

}  // namespace

OffloadEngine* engine_for(const c10::Device& device) {
  int index = kCpu;
  if (device.is_cuda()) {
#ifdef STOWAGE_TORCH_CUDA
    index = device.has_index() ? device.index() : c10::cuda::current_device();
#else
    return nullptr;
#endif
  } else if (!device.is_cpu()) {
    return nullptr;
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const auto it = r.engines.find(index);
  if (it != r.engines.end()) return it->second;
  OffloadEngine* engine = nullptr;
  if (index == kCpu) {
    engine = make_cpu_engine();
  } else {
#ifdef STOWAGE_TORCH_CUDA
    engine = make_cuda_engine(index);
#endif
  }
  if (engine != nullptr) r.engines.emplace(index, engine);
  return engine;
}

bool offloadable(const c10::Device& device, const void* data) {
  if (device.is_cuda()) return true;
  if (!device.is_cpu()) return false;
  CachingAllocator* allocator = torch_cpu::allocator();
  return allocator != nullptr && allocator->block_size(data) != 0;
}

std::unique_ptr<ComputeTimeline> current_timeline(const c10::Device& device,
                                                  OffloadEngine& engine) {
#ifdef STOWAGE_TORCH_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
    return std::make_unique<DeviceStreamTimeline>(
        engine.backend(), Stream{reinterpret_cast<std::uintptr_t>(stream.stream())});
  }
#endif
  STOWAGE_CHECK(device.is_cpu(), "no compute timeline for ", device.str());
  return std::make_unique<HostThreadTimeline>(engine.backend());
}

void for_each_engine(const std::function<void(int device, OffloadEngine&)>& fn) {
  std::map<int, OffloadEngine*> engines;
  {
    std::lock_guard lock(registry().mutex);
    engines = registry().engines;
  }
  for (const auto& [index, engine] : engines) fn(index, *engine);
}

}  // namespace stowage::torch_offload
