// What a malloc+free pair costs in the CachingAllocator, beside glibc's malloc/free measured in
// the same run for scale:
//   cached_hit/one_size     the same 64 KiB request again and again (the block is cached)
//   cached_hit/mixed_sizes  requests cycling through 256 log-uniform sizes from 512 B to 8 MiB,
//                           with 64 blocks kept live so the cache holds split, varied blocks
//   miss_path               a request no cached block fits: a new segment from the simulated
//                           device, then free and empty_cache give it back
// each at 1, 4 and 16 threads sharing one allocator (glibc: one process heap). The simulated
// device runs synchronously so only the allocator is measured.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "device/host/host_backend.hpp"

namespace {

using stowage::kGiB;
using stowage::kMiB;

constexpr std::size_t kOneSize = 64 * 1024;
constexpr std::size_t kMixedSizes = 256;
constexpr std::size_t kLiveWindow = 64;

std::vector<std::size_t> mixed_sizes() {
  std::mt19937_64 random(42);
  std::uniform_real_distribution<double> exponent(std::log(512.0), std::log(8.0 * 1024 * 1024));
  std::vector<std::size_t> sizes(kMixedSizes);
  for (auto& size : sizes) size = static_cast<std::size_t>(std::exp(exponent(random)));
  return sizes;
}

// One allocator per benchmark run, shared by its threads.
struct Shared {
  std::unique_ptr<stowage::HostBackend> backend;
  std::unique_ptr<stowage::CachingAllocator> allocator;

  void start() {
    stowage::HostBackendOptions options;
    options.capacity_bytes = 16 * kGiB;
    options.synchronous = true;
    backend = std::make_unique<stowage::HostBackend>(options);
    allocator = std::make_unique<stowage::CachingAllocator>(*backend);
  }
  void stop() {
    allocator.reset();
    backend.reset();
  }
};
Shared shared;

// Setup and Teardown run once per benchmark run, before its threads start and after they end.
void start_shared(const benchmark::State&) { shared.start(); }
void stop_shared(const benchmark::State&) { shared.stop(); }

void cached_hit_one_size(benchmark::State& state) {
  stowage::CachingAllocator& allocator = *shared.allocator;
  allocator.free(allocator.malloc(kOneSize));  // warm the cache
  for (auto _ : state) {
    void* ptr = allocator.malloc(kOneSize);
    benchmark::DoNotOptimize(ptr);
    allocator.free(ptr);
  }
}

void glibc_one_size(benchmark::State& state) {
  for (auto _ : state) {
    void* ptr = std::malloc(kOneSize);
    benchmark::DoNotOptimize(ptr);
    std::free(ptr);
  }
}

// Keeps kLiveWindow blocks live; each pair frees the oldest and allocates the next size.
template <typename Malloc, typename Free>
void mixed_pairs(benchmark::State& state, Malloc&& malloc_fn, Free&& free_fn) {
  const std::vector<std::size_t> sizes = mixed_sizes();
  std::vector<void*> live(kLiveWindow, nullptr);
  std::size_t next = static_cast<std::size_t>(state.thread_index()) * 17;
  for (std::size_t i = 0; i < kLiveWindow; ++i) live[i] = malloc_fn(sizes[(next++) % kMixedSizes]);
  std::size_t slot = 0;
  for (auto _ : state) {
    free_fn(live[slot]);
    live[slot] = malloc_fn(sizes[(next++) % kMixedSizes]);
    benchmark::DoNotOptimize(live[slot]);
    slot = (slot + 1) % kLiveWindow;
  }
  for (void* ptr : live) free_fn(ptr);
}

void cached_hit_mixed_sizes(benchmark::State& state) {
  stowage::CachingAllocator& allocator = *shared.allocator;
  mixed_pairs(
      state, [&](std::size_t size) { return allocator.malloc(size); },
      [&](void* ptr) { allocator.free(ptr); });
}

void glibc_mixed_sizes(benchmark::State& state) {
  mixed_pairs(
      state, [](std::size_t size) { return std::malloc(size); }, [](void* ptr) { std::free(ptr); });
}

void miss_path(benchmark::State& state) {
  stowage::HostBackendOptions options;
  options.capacity_bytes = 16 * kGiB;
  options.synchronous = true;
  stowage::HostBackend backend(options);
  stowage::CachingAllocator allocator(backend);
  for (auto _ : state) {
    void* ptr = allocator.malloc(32 * kMiB);  // the cache is empty: a new segment
    benchmark::DoNotOptimize(ptr);
    allocator.free(ptr);
    allocator.empty_cache();
  }
}

}  // namespace

BENCHMARK(cached_hit_one_size)->Setup(start_shared)->Teardown(stop_shared)->Threads(1)->Threads(4)->Threads(16);
BENCHMARK(glibc_one_size)->Threads(1)->Threads(4)->Threads(16);
BENCHMARK(cached_hit_mixed_sizes)->Setup(start_shared)->Teardown(stop_shared)->Threads(1)->Threads(4)->Threads(16);
BENCHMARK(glibc_mixed_sizes)->Threads(1)->Threads(4)->Threads(16);
BENCHMARK(miss_path);

BENCHMARK_MAIN();
