#include "python/tensors/cpu_allocator.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <memory>
#include <mutex>

#include "base/errors.hpp"

namespace stowage::torch_cpu {

namespace {

// The process-wide CPU-mode state; heap-allocated and never freed (see the header).
struct State {
  CpuModeOptions options;
  HostBackend* backend = nullptr;
  CachingAllocator* allocator = nullptr;
  c10::Allocator* previous = nullptr;  // torch's allocator before enable()
  bool enabled = false;
};

// SetCPUAllocator ignores a call whose priority is below the highest seen; stowage always uses
// the highest, so enable and disable alternate as often as asked.
constexpr std::uint8_t kPriority = 255;

std::mutex& state_mutex() {
  static std::mutex mutex;
  return mutex;
}

State& state() {
  static State* instance = new State();
  return *instance;
}

// torch.profiler(profile_memory=True) hears of every allocation and free, as from torch's own
// CPU allocator; the figures are looked up only while it listens.
void report_to_profiler(void* ptr, std::int64_t bytes) {
  const DeviceStats stats = state().allocator->stats();
  c10::reportMemoryUsageToProfiler(ptr, bytes,
                                   static_cast<std::size_t>(stats.allocated_bytes.all().current),
                                   static_cast<std::size_t>(stats.reserved_bytes.all().current),
                                   c10::Device(c10::DeviceType::CPU));
}

void free_block(void* ptr) {
  if (ptr != nullptr && c10::memoryProfilingEnabled()) {
    const auto bytes = static_cast<std::int64_t>(state().allocator->block_size(ptr));
    state().allocator->free(ptr);
    report_to_profiler(ptr, -bytes);
    return;
  }
  state().allocator->free(ptr);
}

class StowageCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    void* ptr = nullptr;
    try {
      ptr = state().allocator->malloc(bytes);
    } catch (const OutOfMemory& error) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, error.message());
    }
    if (ptr != nullptr && c10::memoryProfilingEnabled()) {
      report_to_profiler(ptr, static_cast<std::int64_t>(state().allocator->block_size(ptr)));
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

// Every lock a thread may hold inside an allocation is taken before fork() and released after,
// in the parent and in the child, so the child never inherits one held by a thread it lacks.
void register_fork_handlers() {
  ::pthread_atfork(
      [] {
        stack_table().prepare_fork();
        state().allocator->prepare_fork();
        state().backend->prepare_fork();
      },
      [] {
        state().backend->after_fork();
        state().allocator->after_fork();
        stack_table().after_fork();
      },
      [] {
        state().backend->after_fork();
        state().allocator->after_fork();
        stack_table().after_fork();
      });
}

}  // namespace

StackTable& stack_table() {
  static auto* table = new StackTable();  // outlives every allocation that refers to it
  return *table;
}

void enable(const CpuModeOptions& options) {
  std::lock_guard lock(state_mutex());
  State& s = state();
  if (s.allocator == nullptr) {
    HostBackendOptions device;
    device.capacity_bytes = options.capacity_bytes;
    device.copy_bytes_per_second = options.copy_bytes_per_second;
    device.pinned_capacity_bytes = options.pinned_bytes;
    auto backend = std::make_unique<HostBackend>(device);
    auto allocator =
        std::make_unique<CachingAllocator>(*backend, parse_allocator_config(options.config));
    s.options = options;
    s.backend = backend.release();
    s.allocator = allocator.release();
    s.allocator->set_context_provider([] { return stack_table().capture(); });
    register_fork_handlers();
  } else {
    STOWAGE_CHECK(options == s.options, "CPU mode was enabled before with capacity ",
                  s.options.capacity_bytes, ", config '", s.options.config, "', copy bandwidth ",
                  s.options.copy_bytes_per_second, " B/s and pinned limit ",
                  s.options.pinned_bytes, "; tensors from then may still be alive, so it cannot "
                  "change now");
  }
  if (s.enabled) return;
  s.previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&torch_allocator(), kPriority);
  STOWAGE_CHECK(c10::GetCPUAllocator() == &torch_allocator(),
                "torch did not accept stowage as its CPU allocator");
  s.enabled = true;
}

void disable() {
  std::lock_guard lock(state_mutex());
  State& s = state();
  if (!s.enabled) return;
  c10::SetCPUAllocator(s.previous, kPriority);
  STOWAGE_CHECK(c10::GetCPUAllocator() == s.previous,
                "torch did not take its own CPU allocator back");
  s.enabled = false;
}

bool is_enabled() {
  std::lock_guard lock(state_mutex());
  return state().enabled;
}

bool owns(const c10::Storage& storage) {
  return storage.data_ptr().get_deleter() == &free_block;
}

CachingAllocator* allocator() {
  std::lock_guard lock(state_mutex());
  return state().allocator;
}

HostBackend* backend() {
  std::lock_guard lock(state_mutex());
  return state().backend;
}

}  // namespace stowage::torch_cpu
