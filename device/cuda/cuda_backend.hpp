// A real NVIDIA GPU as a DeviceBackend (Note [Device seam] in backend.hpp): the CUDA runtime for
// segments, streams, events, copies and pinned memory, and the driver's virtual-memory calls.
//
// This header includes no CUDA header, so code built without the CUDA toolkit can name these
// functions; the backend itself lives in cuda_backend.cpp, the only file that includes CUDA
// headers. Only libcudart is linked: the driver's virtual-memory calls are looked up once per
// backend through cudaGetDriverEntryPointByVersion.
//
// Guarantees: each call makes the backend's device current for its duration and then gives the
// calling thread its previous device back (skipping cudaSetDevice when it is already current).
// One exception: when the previous device has no primary context yet, it is not restored,
// because cudaSetDevice would create a context (hundreds of MiB) on a device the thread never
// used; the thread is then left on the backend's device. Calls that reach the driver make sure
// the runtime's primary context is current on the calling thread first. Stream{0} is the legacy
// default stream of the device; create_stream() makes non-blocking streams (no implicit
// synchronisation with Stream{0}), and any cudaStream_t of the device (one handed over by
// PyTorch, say) may be passed where a Stream is taken, except to destroy_stream.
//
// Thread safety: every member function may be called from any thread concurrently; CUDA's calls
// are thread-safe and the only state of the backend's own (the table of the streams and events
// it created) is guarded by a mutex. Destroying a stream or event while another thread uses it is
// the caller's bug, as with CUDA.
//
// Ownership: the streams and events the backend created are its own: destroy_stream and
// destroy_event take only those (others are a LogicError), and destroying the backend
// synchronizes and destroys the ones still alive. Memory is the caller's: segments,
// reservations, physical handles and pinned buffers still alive when the backend is destroyed
// are neither freed nor tracked (the layer above may still hold them; the process's exit returns
// them), so free them first.
//
// VMM rules: the backend does not check the VMM rules of backend.hpp itself; it passes each call
// to the driver, which judges it. A call the driver refuses is a BackendError here (where
// HostBackend raises LogicError). The driver is more lenient than HostBackend: it may accept what
// HostBackend refuses, such as mapping part of a handle, a mapping that spans two reservations,
// releasing a reservation that still has mappings, or set_access over part of a mapping. Code
// must follow the rules of backend.hpp regardless: a breach shows on HostBackend, not
// necessarily here.
//
// Errors: out-of-memory from try_allocate_segment, try_create_physical and try_allocate_pinned
// is a soft failure (empty result; the runtime's last error is cleared). Every other CUDA
// failure throws BackendError naming the call and CUDA's error name and text. The VMM calls
// throw BackendError when properties().virtual_memory is false. Misuse the backend can see
// without asking CUDA throws LogicError: bytes == 0 to try_allocate_segment /
// try_allocate_pinned, nullptr to free_segment / free_pinned, Stream{0} or a stream it did not
// create to destroy_stream, an event it did not create (or Event{0}, or one destroyed), an empty
// function, or a host function enqueued on a stream under graph capture (it would run at every
// replay but is freed after its first run) or on Stream{0} while a blocking stream of the device
// is capturing (the launch would break that capture). A host function that throws despite the
// contract is reported on stderr and dropped.
#pragma once

#include <memory>

#include "device/backend.hpp"

namespace stowage {

// The number of CUDA devices; 0 when CUDA reports none or fails (no driver, no GPU). Never
// throws, never prints.
int cuda_device_count() noexcept;
// Whether at least one CUDA device can be used.
inline bool cuda_available() noexcept { return cuda_device_count() > 0; }
// Opens CUDA device `device_index` (a CUDA runtime ordinal) and initialises its primary context.
// Throws LogicError for an index out of range, BackendError when CUDA fails (no driver, no
// device).
std::unique_ptr<DeviceBackend> open_cuda_device(int device_index);

}  // namespace stowage
