#include "python/src/torch/cpu_allocator.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <memory>
#include <mutex>

#include "allocator/errors.hpp"
#include "allocator/host_backend.hpp"

namespace stowage::torch_cpu {

namespace {

// The process-wide CPU-mode state; heap-allocated and never freed (see the header).
struct State {
  std::size_t capacity = 0;
  std::string config;
  HostBackend* backend = nullptr;
  CachingAllocator* allocator = nullptr;
  c10::Allocator* previous = nullptr;  // torch's allocator before enable()
  bool enabled = false;
  std::uint8_t priority = 100;  // SetCPUAllocator keeps the highest priority seen
};

std::mutex& state_mutex() {
  static std::mutex mutex;
  return mutex;
}

State& state() {
  static State* instance = new State();
  return *instance;
}

void free_block(void* ptr) { state().allocator->free(ptr); }

class StowageCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    void* ptr = nullptr;
    try {
      ptr = state().allocator->malloc(bytes);
    } catch (const OutOfMemory& error) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, error.message());
    }
    return {ptr, ptr, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

StowageCpuAllocator& torch_allocator() {
  static StowageCpuAllocator* instance = new StowageCpuAllocator();
  return *instance;
}

void register_fork_handlers() {
  ::pthread_atfork([] { state().allocator->prepare_fork(); },
                   [] { state().allocator->after_fork(); },
                   [] { state().allocator->after_fork(); });
}

}  // namespace

void enable(std::size_t capacity_bytes, const std::string& config) {
  std::lock_guard lock(state_mutex());
  State& s = state();
  if (s.allocator == nullptr) {
    HostBackendOptions options;
    options.capacity_bytes = capacity_bytes;
    options.synchronous = true;  // no stream threads: fork() and interpreter exit stay simple
    auto backend = std::make_unique<HostBackend>(options);
    auto allocator = std::make_unique<CachingAllocator>(*backend, parse_allocator_config(config));
    s.capacity = capacity_bytes;
    s.config = config;
    s.backend = backend.release();
    s.allocator = allocator.release();
    register_fork_handlers();
  } else {
    STOWAGE_CHECK(capacity_bytes == s.capacity && config == s.config,
                  "CPU mode was enabled before with capacity ", s.capacity, " and config '",
                  s.config, "'; tensors from then may still be alive, so it cannot change now");
  }
  if (s.enabled) return;
  s.previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&torch_allocator(), ++s.priority);
  s.enabled = true;
}

void disable() {
  std::lock_guard lock(state_mutex());
  State& s = state();
  if (!s.enabled) return;
  c10::SetCPUAllocator(s.previous, ++s.priority);
  s.enabled = false;
}

bool is_enabled() {
  std::lock_guard lock(state_mutex());
  return state().enabled;
}

CachingAllocator* allocator() {
  std::lock_guard lock(state_mutex());
  return state().allocator;
}

}  // namespace stowage::torch_cpu
