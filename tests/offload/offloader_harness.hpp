// An offloader over the simulated device, for the offloader's tests: device buffers from a
// CachingAllocator, written and read through the device's copies.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "base/byte_units.hpp"
#include "device/host/host_backend.hpp"
#include "offload/offload_engine.hpp"
#include "tests/conformance/pattern.hpp"

namespace stowage::testing {

struct OffloaderHarnessOptions {
  std::size_t capacity = 256 * kMiB;
  double bandwidth = 0;                 // bytes per second of copies; 0: memcpy speed
  std::optional<std::size_t> prefetch;  // buffers ahead; nullopt: adaptive
  std::size_t pinned_limit = 0;         // the pool's host memory; 0: the host's
  bool room = true;                     // prefetch into the allocator's free memory
};

class OffloaderHarness {
 public:
  explicit OffloaderHarness(OffloaderHarnessOptions options = {})
      : backend_(device_options(options)), allocator_(backend_) {
    OffloadEngineOptions engine;
    engine.prefetch_depth = options.prefetch;
    engine.pool.limit_bytes = options.pinned_limit;
    const bool room = options.room;
    engine_ = std::make_unique<OffloadEngine>(
        backend_, &allocator_,
        [this](std::size_t bytes, Stream stream) { return allocate(bytes, stream); },
        [this, room]() -> std::size_t { return room ? allocator_.largest_available_block() : 0; },
        engine);
  }
  ~OffloaderHarness() { engine_.reset(); }

  HostBackend& backend() { return backend_; }
  CachingAllocator& allocator() { return allocator_; }
  OffloadEngine& engine() { return *engine_; }
  Offloader& offloader() { return engine_->offloader(); }

  DeviceBuffer allocate(std::size_t bytes, Stream stream = {}) {
    void* ptr = allocator_.malloc(bytes, stream);
    CachingAllocator* allocator = &allocator_;
    return {ptr, bytes, std::shared_ptr<void>(ptr, [allocator](void* p) { allocator->free(p); })};
  }
  // A buffer holding pattern(bytes, seed).
  DeviceBuffer filled(std::size_t bytes, std::uint32_t seed) {
    DeviceBuffer buffer = allocate(bytes);
    const auto data = pattern(bytes, seed);
    backend_.copy_async(buffer.data, data.data(), bytes, Stream{0});
    backend_.synchronize_stream(Stream{0});
    return buffer;
  }
  std::vector<std::uint8_t> read(const DeviceBuffer& buffer) {
    std::vector<std::uint8_t> out(buffer.bytes);
    backend_.copy_async(out.data(), buffer.data, buffer.bytes, Stream{0});
    backend_.synchronize_stream(Stream{0});
    return out;
  }
  std::int64_t device_allocated() const {
    return allocator_.stats().allocated_bytes.all().current;
  }

 private:
  static HostBackendOptions device_options(const OffloaderHarnessOptions& options) {
    HostBackendOptions out;
    out.capacity_bytes = options.capacity;
    out.copy_bytes_per_second = options.bandwidth;
    return out;
  }

  HostBackend backend_;
  CachingAllocator allocator_;
  std::unique_ptr<OffloadEngine> engine_;
};

}  // namespace stowage::testing
