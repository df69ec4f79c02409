/* stowage's plain C interface, exported by libstowage.so: the functions torch's
 * CUDAPluggableAllocator loads, for torch builds that stowage's own torch allocator (the
 * stowage._torch module) cannot be compiled against.
 *
 *   import torch, stowage
 *   a = torch.cuda.memory.CUDAPluggableAllocator(stowage.c_library_path(),
 *                                                "stowage_malloc", "stowage_free")
 *   torch.cuda.memory.change_current_allocator(a)     # before CUDA is initialised
 *
 * It serves the same allocator per device as the rest of stowage in the process. Through this
 * interface torch's memory_stats and snapshots are not available (torch's pluggable allocator
 * refuses them) and an out-of-memory is a failed allocation that torch reports as a plain
 * RuntimeError; stowage.memory_stats() and stowage_last_error() still tell what happened.
 * No function throws or aborts: failures return NULL or nonzero and set the thread's last
 * error. Streams are cudaStream_t passed as void*. */
#ifndef STOWAGE_C_API_H
#define STOWAGE_C_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* torch's alloc_fn: size bytes on `device`, ordered on `stream`; NULL on failure. */
void* stowage_malloc(size_t size, int device, void* stream);
/* torch's free_fn: torch passes back the size, device and stream of the allocation. A size
 * other than the one given to stowage_malloc (0: not known) leaves the memory allocated, and
 * stowage counts it in num_invalid_frees and logs both sizes: the pointer is then not the
 * allocation the caller thinks it is, and freeing it could hand a live tensor's memory out. */
void stowage_free(void* ptr, size_t size, int device, void* stream);
/* torch's init_fn: nothing to do before the first allocation; kept for the hook. */
void stowage_init(int device_count);
/* torch's reset_fn (torch.cuda.empty_cache()): gives cached memory back on every device. */
void stowage_reset(void);
/* torch's memory_fraction_fn: caps device `device` at fraction x its memory. */
void stowage_set_memory_fraction(double fraction, int device);
/* torch's record_stream_fn: `stream` uses ptr too; its free waits for that stream's work. */
void stowage_record_stream(void* ptr, void* stream);
/* torch's base_alloc_fn: the start of the device range ptr lies in; its size into *size. */
void* stowage_base_alloc(void* ptr, size_t* size);
/* Sets the configuration (STOWAGE_ALLOC_CONF's syntax) before the first allocation; 0 on
 * success. Without it, the first allocation reads STOWAGE_ALLOC_CONF (unset: defaults). */
int stowage_configure(const char* config);
/* The calling thread's last failure, or "" if none. Valid until its next stowage call. */
const char* stowage_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* STOWAGE_C_API_H */
