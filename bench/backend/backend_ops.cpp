// What the device calls that the allocator and the offload engine are built on cost: segment
// allocation, the virtual-memory cycle (create, map, set access, unmap, release), events, and
// copy bandwidth with pinned and pageable host memory. Runs on HostBackend always and on every
// GPU when CudaBackend is built and a GPU is present, so both appear side by side in one run.
#include <benchmark/benchmark.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/build_info.hpp"
#include "device/host/host_backend.hpp"
#if STOWAGE_HAVE_CUDA
#include "device/cuda/cuda_backend.hpp"
#endif

namespace {

using stowage::DeviceBackend;
using stowage::kMiB;

void segment_cycle(benchmark::State& state, DeviceBackend& backend) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* segment = backend.try_allocate_segment(bytes);
    if (segment == nullptr) {
      state.SkipWithError("out of memory");
      return;
    }
    backend.free_segment(segment);
  }
}

void vmm_cycle(benchmark::State& state, DeviceBackend& backend) {
  const std::size_t g = backend.properties().granularity;
  const std::size_t chunks = static_cast<std::size_t>(state.range(0));
  char* range = static_cast<char*>(backend.reserve_address_range(chunks * g));
  std::vector<stowage::PhysicalHandle> handles(chunks);
  for (auto _ : state) {
    for (std::size_t i = 0; i < chunks; ++i) {
      const auto handle = backend.try_create_physical(g);
      if (!handle) {
        state.SkipWithError("out of memory");
        return;
      }
      handles[i] = *handle;
      backend.map(range + i * g, g, handles[i]);
    }
    backend.set_access(range, chunks * g);
    backend.unmap(range, chunks * g);
    for (const auto handle : handles) backend.release_physical(handle);
  }
  backend.release_address_range(range, chunks * g);
  state.counters["chunks/s"] = benchmark::Counter(static_cast<double>(chunks),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void event_cycle(benchmark::State& state, DeviceBackend& backend) {
  const stowage::Event event = backend.create_event();
  for (auto _ : state) {
    backend.record_event(event, stowage::Stream{0});
    benchmark::DoNotOptimize(backend.query_event(event));
  }
  backend.synchronize_event(event);
  backend.destroy_event(event);
}

void copy_to_device(benchmark::State& state, DeviceBackend& backend, bool pinned) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  void* device = backend.try_allocate_segment(bytes);
  std::vector<char> pageable;
  void* host = nullptr;
  if (pinned) {
    host = backend.try_allocate_pinned(bytes);
  } else {
    pageable.assign(bytes, 1);
    host = pageable.data();
  }
  if (device == nullptr || host == nullptr) {
    state.SkipWithError("out of memory");
    return;
  }
  const stowage::Stream stream = backend.create_stream();
  for (auto _ : state) {
    backend.copy_async(device, host, bytes, stream);
    backend.synchronize_stream(stream);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes));
  backend.destroy_stream(stream);
  if (pinned) backend.free_pinned(host);
  backend.free_segment(device);
}

void register_all(const std::string& prefix, DeviceBackend& backend) {
  benchmark::RegisterBenchmark((prefix + "/segment_alloc_free").c_str(), segment_cycle,
                               std::ref(backend))
      ->Arg(2 * kMiB)->Arg(20 * kMiB)->Arg(256 * kMiB);
  if (backend.properties().virtual_memory) {
    benchmark::RegisterBenchmark((prefix + "/vmm_create_map_unmap_release").c_str(), vmm_cycle,
                                 std::ref(backend))
        ->Arg(1)->Arg(16);
  }
  benchmark::RegisterBenchmark((prefix + "/event_record_query").c_str(), event_cycle,
                               std::ref(backend));
  benchmark::RegisterBenchmark((prefix + "/copy_h2d_pageable").c_str(), copy_to_device,
                               std::ref(backend), false)
      ->Arg(64 * kMiB)->UseRealTime();
  benchmark::RegisterBenchmark((prefix + "/copy_h2d_pinned").c_str(), copy_to_device,
                               std::ref(backend), true)
      ->Arg(64 * kMiB)->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  stowage::HostBackendOptions options;
  options.capacity_bytes = 8 * stowage::kGiB;
  stowage::HostBackend host(options);
  register_all("host", host);
#if STOWAGE_HAVE_CUDA
  std::vector<std::unique_ptr<stowage::DeviceBackend>> gpus;
  for (int device = 0; device < stowage::cuda_device_count(); ++device) {
    gpus.push_back(stowage::open_cuda_device(device));
    register_all("cuda" + std::to_string(device), *gpus.back());
  }
#endif
  benchmark::AddCustomContext("stowage", std::string(stowage::build_info::kVersion));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
