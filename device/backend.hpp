// The one seam between stowage and a device (Note [Device seam]).
//
// Note [Device seam]
// Everything stowage does to a device goes through DeviceBackend: the caching allocator, the
// offload engine and the tools never call CUDA themselves. Two implementations exist:
// CudaBackend (the CUDA runtime, plus the driver's virtual-memory calls reached through
// cudaGetDriverEntryPointByVersion) and HostBackend (a simulated device in host memory that
// enforces the same rules). Code that passes on HostBackend therefore passes on a GPU, and the
// whole project is testable without one. The interface mirrors CUDA's vocabulary on purpose:
// a reader who knows cudaMalloc / cuMemMap / cudaEventRecord knows what each call does.
//
// Contract shared by every backend:
//   - Thread safety: every member function may be called from any thread concurrently.
//   - Soft failures: try_allocate_segment and try_create_physical return an empty value when the
//     device is out of memory (and leave the backend fully usable). Every other failure throws
//     BackendError (the device refused) or LogicError (the caller broke a rule below).
//   - Streams are in-order queues; work enqueued on one stream runs after the work enqueued on
//     it before. Stream{0} is the device's default stream and always exists.
//   - Virtual memory rules (CUDA's, enforced by HostBackend so they cannot be forgotten):
//       * reservations, handle sizes and mapping sizes are multiples of granularity();
//       * a handle is mapped whole, at offset 0 of the handle, into a reserved, unmapped range;
//       * memory is accessible only after set_access() covers it;
//       * unmap() covers exactly whole mappings (one or several adjacent), never part of one;
//       * release_physical() drops the handle; its memory returns to the device once every
//         mapping of it is unmapped too;
//       * release_address_range() needs the whole reservation and no mapping left inside it.
//   - Pointers returned by segments and reservations are device addresses: use them through
//     copy_async / memset_async (on HostBackend they are also host-addressable, on a GPU not).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace stowage {

// A stream of the backend. The value is the backend's native handle (a cudaStream_t for
// CudaBackend), so a stream handed over by PyTorch can be used as is. Stream{0} is the default.
struct Stream {
  std::uintptr_t handle = 0;
  friend bool operator==(Stream, Stream) = default;
};

// An event of the backend, created by create_event(). Never-recorded events count as complete.
struct Event {
  std::uintptr_t handle = 0;
  friend bool operator==(Event, Event) = default;
};

// A handle to physical device memory created by try_create_physical().
struct PhysicalHandle {
  std::uint64_t value = 0;
  friend bool operator==(PhysicalHandle, PhysicalHandle) = default;
};

// Free and total device memory, as cudaMemGetInfo reports them.
struct MemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

// What stays true about a device for its lifetime.
struct DeviceProperties {
  std::string name;               // "NVIDIA H100 80GB HBM3", "HostBackend (simulated)"
  int device_index = 0;           // the CUDA ordinal, or the simulated device's number
  std::size_t total_bytes = 0;    // device memory capacity
  bool virtual_memory = false;    // whether the reserve/create/map calls are available
  std::size_t granularity = 0;    // VMM granularity in bytes (0 without virtual memory)
  std::string pci_bus_id;         // "0000:17:00.0"; empty on a simulated device
  bool simulated = false;         // a device simulated in host memory (HostBackend)
};

// The abstract device. See Note [Device seam] above for the contract.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  DeviceBackend() = default;
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;

  // --- properties ---
  virtual const DeviceProperties& properties() const noexcept = 0;
  virtual MemoryInfo memory_info() = 0;

  // --- segments: like cudaMalloc / cudaFree ---
  // Returns nullptr when the device is out of memory. bytes > 0.
  virtual void* try_allocate_segment(std::size_t bytes) = 0;
  // ptr must have come from try_allocate_segment and not have been freed.
  virtual void free_segment(void* ptr) = 0;

  // --- virtual memory: like cuMemAddressReserve / cuMemCreate / cuMemMap ... ---
  // Throws BackendError when properties().virtual_memory is false.
  virtual void* reserve_address_range(std::size_t bytes, std::size_t alignment = 0) = 0;
  virtual void release_address_range(void* base, std::size_t bytes) = 0;
  // Returns nullopt when the device is out of memory.
  virtual std::optional<PhysicalHandle> try_create_physical(std::size_t bytes) = 0;
  virtual void release_physical(PhysicalHandle handle) = 0;
  // Maps the whole handle at `address`; handle_offset exists to mirror cuMemMap and must be 0.
  virtual void map(void* address, std::size_t bytes, PhysicalHandle handle,
                   std::size_t handle_offset = 0) = 0;
  // Makes [address, address + bytes) readable and writable by the device; mapped ranges only.
  virtual void set_access(void* address, std::size_t bytes) = 0;
  virtual void unmap(void* address, std::size_t bytes) = 0;

  // --- streams and events ---
  virtual Stream create_stream() = 0;
  // Waits for the stream's work, then destroys it. The default stream cannot be destroyed.
  virtual void destroy_stream(Stream stream) = 0;
  virtual void synchronize_stream(Stream stream) = 0;
  virtual void synchronize_device() = 0;
  virtual Event create_event() = 0;
  virtual void destroy_event(Event event) = 0;
  // Captures the work enqueued on `stream` so far; the event completes when that work has run.
  virtual void record_event(Event event, Stream stream) = 0;
  // True when the work captured by the latest record_event has run. Never blocks.
  virtual bool query_event(Event event) = 0;
  virtual void synchronize_event(Event event) = 0;
  // Work enqueued on `stream` after this call waits for the event's latest recording.
  virtual void stream_wait_event(Stream stream, Event event) = 0;
  // An event whose recordings also keep when they completed (an event without
  // cudaEventDisableTiming), for elapsed_seconds.
  virtual Event create_timing_event() = 0;
  // Seconds from the completion of start's latest recording to end's (negative when end's came
  // first). Both must be timing events whose latest recordings have completed: LogicError
  // otherwise. Never blocks.
  virtual double elapsed_seconds(Event start, Event end) = 0;

  // --- work on streams ---
  // dst and src may each be device or host memory (like cudaMemcpyDefault under UVA).
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) = 0;
  virtual void memset_async(void* dst, int value, std::size_t bytes, Stream stream) = 0;
  // Runs `fn` on a host thread once the stream's earlier work is done (cudaLaunchHostFunc).
  // fn must not call back into the backend and must not throw.
  virtual void enqueue_host_function(Stream stream, std::function<void()> fn) = 0;

  // --- pinned (page-locked) host memory: like cudaHostAlloc / cudaFreeHost ---
  // Returns nullptr when the host cannot pin that much.
  virtual void* try_allocate_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(void* ptr) = 0;
  // Pins host memory the caller allocated (cudaHostRegister), so copies to and from it run at
  // full speed: [ptr, ptr + bytes), page-aligned, not pinned already. False when the host will
  // not pin that much (ulimit -l, no memory); the memory is then still usable, pageable.
  virtual bool try_register_host(void* ptr, std::size_t bytes) = 0;
  // Unpins memory pinned by try_register_host (cudaHostUnregister); ptr is the start it had.
  virtual void unregister_host(void* ptr) = 0;
};

}  // namespace stowage
