// HostBackend: a simulated device in host memory, the default wherever no GPU is present.
//
// It is a real device, not a mock: memory is host memory that tests can fill and check; the
// capacity is enforced (segments plus physical handles never exceed it, and a request over it
// fails as cudaMalloc does); virtual memory follows CUDA's rules (Note [Host virtual memory]);
// streams run on worker threads (Note [Host streams]); copies are memcpy, optionally slowed to a
// bandwidth. So code that passes on HostBackend passes on a GPU.
//
// - Segments are carved from one MAP_NORESERVE region (Note [Host segments]): an 80 GiB device
//   costs no RAM until its pages are touched, and a freed segment's pages are reused cheaply.
// - The kernel limits a process to vm.max_map_count mappings (about 65k). HostBackend counts the
//   kernel mappings it creates (the segment region and any segment that did not fit it, pinned
//   buffers, reservations, and two per mapped handle, for the split reservation around it) and refuses, with a BackendError naming the limit, any call
//   that would pass max_mappings.
// - A cost model: every call counted is charged options().call_costs' time for its kind
//   (host_call_costs.hpp), summed in charged_ns(), so replays can tell what the device calls
//   would cost on a GPU.
// - Fault injection: faults().fail_nth(BackendCall::kMap, 3) makes the third map from now fail;
//   faults().corrupt_nth(BackendCall::kCopy, 1) makes the next copy flip one byte it writes.
//   try_* calls then report out-of-memory; every other call throws BackendError and changes
//   nothing.
//
// Contract: thread-safe (one lock for memory state; streams have their own). Memory handed out
// stays valid until freed or until the backend is destroyed, which first drains every stream.
// Invariant (check_invariants): used_bytes() == segment bytes + physical handle bytes <= capacity.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "base/byte_units.hpp"
#include "device/backend.hpp"
#include "device/fault_injector.hpp"
#include "device/host/host_call_costs.hpp"
#include "device/host/host_segment_memory.hpp"
#include "device/host/host_streams.hpp"
#include "device/host/host_virtual_memory.hpp"

namespace stowage {

struct HostBackendOptions {
  std::size_t capacity_bytes = 16 * kGiB;  // the simulated device's memory
  std::size_t granularity = 2 * kMiB;      // VMM granularity, as on current NVIDIA GPUs
  bool synchronous = false;                // run stream work inline (replay, deterministic tests)
  double copy_bytes_per_second = 0;        // bandwidth limit of copies; 0 = memcpy speed; else
                                           // kFloorBytesPerSecond (10 MB/s) to kMaxCopyBytesPerSecond
  std::size_t pinned_capacity_bytes = 0;   // limit on pinned host memory (allocated or
                                           // registered: ulimit -l); 0 = none
  std::size_t max_mappings = 0;            // kernel mappings allowed; 0 = from vm.max_map_count
  bool release_freed_memory = false;       // give freed segments' and handles' RAM back at once
  // Map handles' memory into reservations for real. Without it the virtual-memory calls keep
  // all their bookkeeping and rules but touch no page tables, and mapped memory must not be
  // accessed: for replays, which never touch memory and would otherwise spend their time in
  // mmap.
  bool back_mappings = true;
  int device_index = 0;
  // What each call would cost on a GPU, charged to charged_ns() (host_call_costs.hpp).
  HostCallCosts call_costs;
};

class HostBackend final : public DeviceBackend {
 public:
  // 1 PiB: far beyond any GPU, and small enough that no size computation can overflow.
  static constexpr std::size_t kMaxCapacity = std::size_t{1} << 50;
  static constexpr double kMaxCopyBytesPerSecond = 1e15;  // 1 PB/s: beyond any link

  // Throws LogicError naming the first bad option.
  explicit HostBackend(HostBackendOptions options = {});
  ~HostBackend() override;

  const DeviceProperties& properties() const noexcept override { return properties_; }
  MemoryInfo memory_info() override;

  void* try_allocate_segment(std::size_t bytes) override;
  void free_segment(void* ptr) override;

  void* reserve_address_range(std::size_t bytes, std::size_t alignment = 0) override;
  void release_address_range(void* base, std::size_t bytes) override;
  std::optional<PhysicalHandle> try_create_physical(std::size_t bytes) override;
  void release_physical(PhysicalHandle handle) override;
  void map(void* address, std::size_t bytes, PhysicalHandle handle,
           std::size_t handle_offset = 0) override;
  void set_access(void* address, std::size_t bytes) override;
  void unmap(void* address, std::size_t bytes) override;

  Stream create_stream() override;
  void destroy_stream(Stream stream) override;
  void synchronize_stream(Stream stream) override;
  void synchronize_device() override;
  Event create_event() override;
  void destroy_event(Event event) override;
  void record_event(Event event, Stream stream) override;
  bool query_event(Event event) override;
  void synchronize_event(Event event) override;
  void stream_wait_event(Stream stream, Event event) override;
  Event create_timing_event() override;
  double elapsed_seconds(Event start, Event end) override;

  void copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  void memset_async(void* dst, int value, std::size_t bytes, Stream stream) override;
  void enqueue_host_function(Stream stream, std::function<void()> fn) override;

  void* try_allocate_pinned(std::size_t bytes) override;
  void free_pinned(void* ptr) override;
  bool try_register_host(void* ptr, std::size_t bytes) override;
  void unregister_host(void* ptr) override;

  // --- simulator-only ---
  const HostBackendOptions& options() const noexcept { return options_; }
  FaultInjector& faults() noexcept { return faults_; }
  // The host time the calls so far would have taken on a GPU, by options().call_costs.
  std::uint64_t charged_ns() const noexcept { return charged_ns_.load(std::memory_order_relaxed); }
  // Device bytes in use: segments plus physical handles (released-but-mapped ones included).
  std::size_t used_bytes() const;
  std::size_t pinned_bytes() const;
  // Kernel mappings this backend holds now, and the most it will hold.
  std::size_t kernel_mappings() const;
  std::size_t max_mappings() const noexcept { return max_mappings_; }
  // Throws InternalError if any accounting identity is broken.
  void check_invariants() const;
  // For pthread_atfork: prepare_fork() finishes the streams' work, stops their threads and takes
  // the memory lock; after_fork() (in the parent and in the child) releases it and starts the
  // threads again, so the child has working streams of its own.
  void prepare_fork();
  void after_fork();

 private:
  static HostBackendOptions validated(HostBackendOptions options);
  // Counts the call (and charges its cost); true when a fault is armed for it.
  bool count_call(BackendCall call, std::uint64_t* call_number = nullptr);
  // Counts the call; throws BackendError if a fault is armed for it.
  void fail_if_injected(BackendCall call);
  // Frees `ptr`, an entry of `live` (one of the tables below, `what` naming its kind in the
  // refusal), after the device's work: release(bytes) gives its memory back, under the lock.
  template <typename Release>
  void free_live(BackendCall call, std::map<std::uintptr_t, std::size_t>& live, void* ptr,
                 const char* what, Release release);
  std::size_t used_bytes_locked() const;
  std::size_t kernel_mappings_locked() const;
  // Throws BackendError if `added` more kernel mappings would pass max_mappings_.
  void check_mapping_room_locked(std::size_t added) const;
  // Throws LogicError unless [ptr, ptr + bytes) lies wholly in host memory, in one segment or
  // pinned buffer, or in accessible mapped memory.
  void check_range_locked(const void* ptr, std::size_t bytes, const char* what) const;

  const HostBackendOptions options_;
  DeviceProperties properties_;
  std::size_t max_mappings_ = 0;
  FaultInjector faults_;
  std::atomic<std::uint64_t> charged_ns_{0};

  mutable std::mutex memory_mutex_;  // guards everything below but streams_
  HostSegmentMemory segment_memory_;
  std::map<std::uintptr_t, std::size_t> segments_;  // base -> bytes
  std::size_t segment_bytes_ = 0;
  std::map<std::uintptr_t, std::size_t> pinned_;      // base -> bytes
  std::map<std::uintptr_t, std::size_t> registered_;  // base -> bytes
  std::size_t pinned_bytes_ = 0;                      // both together
  HostVirtualMemory virtual_memory_;

  HostStreamSet streams_;  // last: destroyed (and drained) before the memory its work touches
};

}  // namespace stowage
