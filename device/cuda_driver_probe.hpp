// CUDA driver and runtime facts for `stowage doctor`: what the NVIDIA driver (libcuda.so.1) and
// a CUDA runtime (libcudart) installed on this machine report, read through dlopen.
//
// Neither library is linked, so the probe runs in every build (without the CUDA toolkit too) and
// on machines without a driver, where it says why there are no GPUs. The driver is asked through
// its own entry points (cuInit, cuDeviceGet*), which are ABI-stable, unlike the runtime's
// cudaDeviceProp; cuInit initialises the driver but creates no context, so torch's CUDA state is
// untouched and stowage can still become torch's allocator afterwards.
//
// Contract: free functions, safe to call from any thread; the libraries stay loaded once opened
// (as a process that uses CUDA keeps them); a fact that cannot be read is empty (std::nullopt), and
// `error` says why a whole library could not be asked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stowage {

struct GpuFacts {
  int index = 0;
  std::optional<std::string> name;
  std::optional<std::uint64_t> total_memory;
  std::optional<std::string> pci_bus_id;          // "0000:3b:00.0"
  std::optional<std::string> compute_capability;  // "9.0"
  std::optional<bool> virtual_memory_management;
};

struct CudaDriverFacts {
  std::optional<std::string> library;  // the loaded file's path
  std::optional<std::string> version;  // "13.0"
  int device_count = 0;
  std::optional<std::string> error;
  std::vector<GpuFacts> gpus;
};

struct CudaRuntimeFacts {
  std::optional<std::string> library;  // the candidate that loaded
  std::optional<std::string> version;
  std::optional<int> device_count;
  std::optional<std::string> error;
};

// "12.4" for 12040, as CUDA encodes versions.
std::string cuda_version_text(int encoded);

// The driver and the GPUs it reports.
CudaDriverFacts probe_cuda_driver();

// The first of `candidates` (paths or sonames, in the order a process would load them) that
// loads: its version and device count, or why it has none.
CudaRuntimeFacts probe_cuda_runtime(const std::vector<std::string>& candidates);

}  // namespace stowage
