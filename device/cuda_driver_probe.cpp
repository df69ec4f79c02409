#include "device/cuda_driver_probe.hpp"

#include <dlfcn.h>

#include <array>
#include <cstddef>
#include <utility>

namespace stowage {

namespace {

// CUdevice_attribute values (cuda.h), fixed by the driver ABI.
constexpr int kComputeCapabilityMajor = 75;
constexpr int kComputeCapabilityMinor = 76;
constexpr int kVirtualMemoryManagementSupported = 102;

// A dlopen handle, closed when it goes.
class Library {
 public:
  // RTLD_NODELETE: a runtime that initialised itself is not unloaded under its exit handlers.
  explicit Library(const std::string& name)
      : handle_(dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {}
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  ~Library() {
    if (handle_ != nullptr) {
      dlclose(handle_);
    }
  }
  bool loaded() const { return handle_ != nullptr; }
  // The entry point `name` as a function pointer of type F; nullptr when the library lacks it, and
  // then `name` is the first it lacks (missing()).
  template <typename F>
  F entry(const char* name) {
    void* symbol = dlsym(handle_, name);
    if (symbol == nullptr && missing_.empty()) missing_ = name;
    return reinterpret_cast<F>(symbol);
  }
  const std::string& missing() const { return missing_; }
  // The path of the file the entry point `name` was loaded from.
  std::optional<std::string> path_of(const char* name) const {
    Dl_info info{};
    void* symbol = dlsym(handle_, name);
    if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return std::nullopt;
    return std::string(info.dli_fname);
  }

 private:
  void* handle_;
  std::string missing_;
};

using GetInt = int (*)(int*);
using GetErrorName = int (*)(int, const char**);
using DeviceGet = int (*)(int*, int);
using DeviceGetText = int (*)(char*, int, int);
using DeviceTotalMem = int (*)(std::size_t*, int);
using DeviceGetAttribute = int (*)(int*, int, int);
using Init = int (*)(unsigned);

std::string driver_error(Library& lib, int status) {
  auto name_of = lib.entry<GetErrorName>("cuGetErrorName");
  const char* name = nullptr;
  if (name_of != nullptr && name_of(status, &name) == 0 && name != nullptr) {
    return name;
  }
  return "CUresult " + std::to_string(status);
}

// The entry points the GPU queries need; all present or the driver is too old.
struct DeviceQueries {
  DeviceGet get;
  DeviceGetText name;
  DeviceGetText bus_id;
  DeviceTotalMem total_memory;
  DeviceGetAttribute attribute;
};

GpuFacts gpu_facts(const DeviceQueries& calls, int index, int device) {
  GpuFacts gpu;
  gpu.index = index;
  std::array<char, 256> text{};
  if (calls.name(text.data(), static_cast<int>(text.size()), device) == 0) {
    gpu.name = std::string(text.data());
  }
  if (calls.bus_id(text.data(), 32, device) == 0) {
    gpu.pci_bus_id = std::string(text.data());
  }
  std::size_t memory = 0;
  if (calls.total_memory(&memory, device) == 0) {
    gpu.total_memory = memory;
  }
  int major = 0;
  int minor = 0;
  if (calls.attribute(&major, kComputeCapabilityMajor, device) == 0 &&
      calls.attribute(&minor, kComputeCapabilityMinor, device) == 0) {
    gpu.compute_capability = std::to_string(major) + "." + std::to_string(minor);
  }
  int vmm = 0;
  if (calls.attribute(&vmm, kVirtualMemoryManagementSupported, device) == 0) {
    gpu.virtual_memory_management = vmm != 0;
  }
  return gpu;
}

// The GPUs of an initialised driver, or the name of the entry point it lacks.
std::string ask_gpus(Library& lib, int count, std::vector<GpuFacts>& gpus) {
  const DeviceQueries calls{lib.entry<DeviceGet>("cuDeviceGet"), lib.entry<DeviceGetText>("cuDeviceGetName"),
                            lib.entry<DeviceGetText>("cuDeviceGetPCIBusId"),
                            lib.entry<DeviceTotalMem>("cuDeviceTotalMem_v2"),
                            lib.entry<DeviceGetAttribute>("cuDeviceGetAttribute")};
  if (!lib.missing().empty()) return lib.missing();
  for (int index = 0; index < count; ++index) {
    int device = 0;
    if (calls.get(&device, index) == 0) {
      gpus.push_back(gpu_facts(calls, index, device));
    }
  }
  return "";
}

}  // namespace

std::string cuda_version_text(int encoded) {
  return std::to_string(encoded / 1000) + "." + std::to_string(encoded % 1000 / 10);
}

CudaDriverFacts probe_cuda_driver() {
  CudaDriverFacts facts;
  Library lib("libcuda.so.1");
  if (!lib.loaded()) {
    facts.error = "no NVIDIA driver (libcuda.so.1 cannot be loaded)";
    return facts;
  }
  facts.library = lib.path_of("cuInit").value_or("libcuda.so.1");
  auto version = lib.entry<GetInt>("cuDriverGetVersion");
  auto init = lib.entry<Init>("cuInit");
  auto count_of = lib.entry<GetInt>("cuDeviceGetCount");
  if (version == nullptr || init == nullptr || count_of == nullptr) {
    facts.error = "the driver lacks cuDriverGetVersion, cuInit or cuDeviceGetCount";
    return facts;
  }
  int encoded = 0;
  if (version(&encoded) == 0) {
    facts.version = cuda_version_text(encoded);
  }
  if (int status = init(0); status != 0) {
    facts.error = "cuInit failed: " + driver_error(lib, status);
    return facts;
  }
  int count = 0;
  if (int status = count_of(&count); status != 0) {
    facts.error = "cuDeviceGetCount failed: " + driver_error(lib, status);
    return facts;
  }
  if (std::string missing = ask_gpus(lib, count, facts.gpus); !missing.empty()) {
    facts.error = "the driver lacks " + missing;
    facts.gpus.clear();
    return facts;
  }
  facts.device_count = static_cast<int>(facts.gpus.size());
  return facts;
}

CudaRuntimeFacts probe_cuda_runtime(const std::vector<std::string>& candidates) {
  using ErrorName = const char* (*)(int);
  CudaRuntimeFacts facts;
  for (const std::string& candidate : candidates) {
    Library lib(candidate);
    if (!lib.loaded()) {
      continue;
    }
    facts.library = candidate;
    auto version = lib.entry<GetInt>("cudaRuntimeGetVersion");
    auto count_of = lib.entry<GetInt>("cudaGetDeviceCount");
    auto error_name = lib.entry<ErrorName>("cudaGetErrorName");
    if (version == nullptr || count_of == nullptr || error_name == nullptr) {
      facts.error = "the runtime lacks cudaRuntimeGetVersion, cudaGetDeviceCount or cudaGetErrorName";
      return facts;
    }
    int encoded = 0;
    if (version(&encoded) == 0) {
      facts.version = cuda_version_text(encoded);
    }
    int count = 0;
    if (int status = count_of(&count); status == 0) {
      facts.device_count = count;
    } else {
      const char* name = error_name(status);
      facts.error = name != nullptr ? std::string(name) : "cudaError " + std::to_string(status);
    }
    return facts;
  }
  facts.error = "no CUDA runtime (libcudart.so cannot be loaded)";
  return facts;
}

}  // namespace stowage
