// stowage as torch's CUDA allocator: the C++ entry point, for the Python module (stowage.enable)
// and for libtorch programs alike (link libstowage_torch.so, call stowage::torch_cuda::enable()
// before the first CUDA tensor).
//
// The allocator is a subclass of torch's CUDAPluggableAllocator over the process's per-device
// CachingAllocators (allocator/process/cuda_allocators.hpp). Besides malloc and free it implements what
// the stock pluggable allocator refuses, so torch's memory API keeps working: device stats and
// their resets, snapshots in torch's own structures (memory_viz reads them), history with
// torch's stack contexts, OOM observers (OOM raises torch.OutOfMemoryError with stowage's
// explanation), cacheInfo for cudnn.benchmark, and the private pools of CUDA graphs, MemPool and
// cudagraph trees (Note [Private pools] in allocator/private_pools.hpp), and
// torch.cuda.caching_allocator_enable (off: each allocation the device's own, uncached_allocations.hpp).
// CUDA IPC is not supported.
//
// Contract: thread-safe; the allocator, once installed, stays for the life of the process.
//
// Note [No CUDA before the program's]
// torch initialises CUDA lazily: `import torch` creates no context and torch.cuda.device_count()
// asks NVML, so a process that has not used CUDA yet can fork children (DataLoader workers,
// multiprocessing) that do. A process that has called into the driver (cuInit, which any CUDA
// runtime call makes) cannot: its children's CUDA calls fail with "initialization error".
// STOWAGE_ALLOC_CONF installs stowage while torch is imported, so installing calls no CUDA
// function; each device's allocator (and its CUDA backend) is made at its first allocation, after
// torch's own lazy initialisation, and the questions torch may ask before (statistics, the
// snapshot) are answered from the allocators that exist.
#pragma once

#include <string>

namespace stowage::torch_cuda {

// Installs stowage as torch's CUDA allocator with `config` (STOWAGE_ALLOC_CONF's syntax).
// Must come before CUDA is initialised in the process: afterwards torch keeps the allocator it
// has and this throws LogicError saying how to enable stowage earlier. Calling it again with the
// same configuration does nothing. Calls no CUDA function (Note [No CUDA before the program's]):
// whether the machine has a device is the caller's to ask first (stowage.enable asks
// torch.cuda.device_count(), which uses NVML).
void enable(const std::string& config);
// Whether stowage is torch's CUDA allocator now.
bool is_enabled();
// The torch versions this build's allocator was written for, e.g. "2.11".
const char* supported_torch_versions();

}  // namespace stowage::torch_cuda
