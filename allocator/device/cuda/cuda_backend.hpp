// DeviceBackend on a real NVIDIA GPU (Note [Device seam] in backend.hpp).
//
// This header includes no CUDA header, so code built without the CUDA toolkit can name
// CudaBackend; the CUDA state lives behind a pointer to an implementation defined in
// cuda_backend.cpp, the only file that includes CUDA headers. Only libcudart is linked: the
// driver's virtual-memory calls are looked up once, in the constructor, through
// cudaGetDriverEntryPointByVersion.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>

#include "allocator/device/backend.hpp"

namespace stowage {

// CudaBackend: one CUDA device, through the CUDA runtime and the driver's VMM calls.
//
// Guarantees: each call makes this backend's device current for its duration and then gives
// the calling thread its previous device back (skipping cudaSetDevice when it is already
// current). One exception: when the previous device has no primary context yet, it is not
// restored, because cudaSetDevice would create a context (hundreds of MiB) on a device the
// thread never used; the thread is then left on this backend's device. Calls that reach the
// driver make sure the runtime's primary context is current on the calling thread first.
// Stream{0} is the legacy default stream of the device; create_stream() makes non-blocking
// streams (no implicit synchronisation with Stream{0}), and any cudaStream_t of this device
// (one handed over by PyTorch, say) may be passed where a Stream is taken, except to
// destroy_stream.
//
// Thread safety: every member function may be called from any thread concurrently; CUDA's
// calls are thread-safe and the only state of the backend's own (the table of the streams and
// events it created) is guarded by a mutex. Destroying a stream or event while another thread
// uses it is the caller's bug, as with CUDA.
//
// Ownership: the streams and events this backend created are its own: destroy_stream and
// destroy_event take only those (others are a LogicError), and destroying the backend
// synchronizes and destroys the ones still alive. Memory is the caller's: segments,
// reservations, physical handles and pinned buffers still alive when the backend is destroyed
// are neither freed nor tracked (the layer above may still hold them; the process's exit
// returns them), so free them first.
//
// VMM rules: this backend does not check the VMM rules of backend.hpp itself; it passes each
// call to the driver, which judges it. A call the driver refuses is a BackendError here (where
// HostBackend raises LogicError). The driver is more lenient than HostBackend: it may accept
// what HostBackend refuses, such as mapping part of a handle, a mapping that spans two
// reservations, releasing a reservation that still has mappings, or set_access over part of a
// mapping. Code must follow the rules of backend.hpp regardless: a breach shows on HostBackend,
// not necessarily here.
//
// Errors: out-of-memory from try_allocate_segment, try_create_physical and try_allocate_pinned
// is a soft failure (empty result; the runtime's last error is cleared). Every other CUDA
// failure throws BackendError naming the call and CUDA's error name and text. The VMM calls
// throw BackendError when properties().virtual_memory is false. Misuse the backend can see
// without asking CUDA throws LogicError: bytes == 0 to try_allocate_segment /
// try_allocate_pinned, nullptr to free_segment / free_pinned, Stream{0} or a stream it did not
// create to destroy_stream, an event it did not create (or Event{0}, or one destroyed), an
// empty function, or a host function enqueued on a stream under graph capture (it would run at
// every replay but is freed after its first run) or on Stream{0} while a blocking stream of the
// device is capturing (the launch would break that capture). A host function that throws
// despite the contract is reported on stderr and dropped.
class CudaBackend final : public DeviceBackend {
 public:
  // Opens CUDA device `device_index` (a CUDA runtime ordinal) and initialises its primary
  // context. Throws LogicError for an index out of range, BackendError when CUDA fails (no
  // driver, no device).
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;

  // The number of CUDA devices; 0 when CUDA reports none or fails (no driver, no GPU).
  // Never throws, never prints.
  static int device_count() noexcept;
  // Whether at least one CUDA device can be used.
  static bool available() noexcept { return device_count() > 0; }

  // --- properties ---
  const DeviceProperties& properties() const noexcept override;
  MemoryInfo memory_info() override;

  // --- segments ---
  void* try_allocate_segment(std::size_t bytes) override;
  void free_segment(void* ptr) override;

  // --- virtual memory ---
  void* reserve_address_range(std::size_t bytes, std::size_t alignment = 0) override;
  void release_address_range(void* base, std::size_t bytes) override;
  std::optional<PhysicalHandle> try_create_physical(std::size_t bytes) override;
  void release_physical(PhysicalHandle handle) override;
  void map(void* address, std::size_t bytes, PhysicalHandle handle,
           std::size_t handle_offset = 0) override;
  void set_access(void* address, std::size_t bytes) override;
  void unmap(void* address, std::size_t bytes) override;

  // --- streams and events ---
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

  // --- work on streams ---
  void copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  void memset_async(void* dst, int value, std::size_t bytes, Stream stream) override;
  void enqueue_host_function(Stream stream, std::function<void()> fn) override;

  // --- pinned host memory ---
  void* try_allocate_pinned(std::size_t bytes) override;
  void free_pinned(void* ptr) override;

 private:
  struct Impl;  // CUDA state: driver entry points, owned streams and events (cuda_backend.cpp)

  std::unique_ptr<Impl> impl_;
};

}  // namespace stowage
