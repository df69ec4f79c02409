// CudaBackend: the CUDA runtime plus the driver's VMM calls (contract in cuda_backend.hpp).
//
// Only libcudart is linked. The driver functions come from cudaGetDriverEntryPointByVersion,
// asked once per backend for the ABI of CUDA 12.0 (kDriverAbiVersion), which is the ABI of every
// PFN_*_vNNNN typedef used below: a newer driver keeps serving those versions.
#include "device/cuda/cuda_backend.hpp"

// The CUDA headers use C casts and 0 for null; silence that when they are not found as system
// headers (-I rather than -isystem).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wzero-as-null-pointer-constant"
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>

#include "base/errors.hpp"

// Throws BackendError when a runtime call returned an error; `what` names the call.
#define STOWAGE_CUDART_THROW_IF(device, status, what)                                      \
  do {                                                                                     \
    const cudaError_t stowage_status = (status);                                           \
    if (stowage_status != cudaSuccess) {                                                   \
      clear_if_last(stowage_status);                                                       \
      STOWAGE_THROW(::stowage::BackendError, what, " failed on CUDA device ", (device),     \
                    ": ", cudaGetErrorName(stowage_status), " (",                          \
                    cudaGetErrorString(stowage_status), ")");                              \
    }                                                                                      \
  } while (false)

#define STOWAGE_CUDART_CHECK(device, call) STOWAGE_CUDART_THROW_IF(device, (call), #call)

// Throws BackendError when a driver call returned an error; the trailing arguments name the
// call and its arguments.
#define STOWAGE_CU_CHECK(backend, status, ...)                                                 \
  do {                                                                                     \
    const CUresult stowage_status = (status);                                              \
    if (stowage_status != CUDA_SUCCESS) {                                                  \
      STOWAGE_THROW(::stowage::BackendError, __VA_ARGS__, " failed on CUDA device ",        \
                    (backend).device_, ": ", (backend).driver_.error_text(stowage_status));        \
    }                                                                                      \
  } while (false)

namespace stowage {
namespace {

constexpr unsigned int kDriverAbiVersion = 12000;

// Clears the runtime's per-thread last error when it is `status`, and nothing else, so that a
// caller checking cudaGetLastError() later (PyTorch does after each kernel launch) does not see
// a failure this backend already handled. Sticky errors cannot be cleared and stay.
void clear_if_last(cudaError_t status) noexcept {
  if (status != cudaSuccess && cudaPeekAtLastError() == status) {
    static_cast<void>(cudaGetLastError());
  }
}

// Device addresses are the same 64 bits as CUdeviceptr; Stream and Event hold native handles.
CUdeviceptr to_cu(const void* ptr) noexcept { return reinterpret_cast<std::uintptr_t>(ptr); }
void* to_pointer(CUdeviceptr ptr) noexcept { return reinterpret_cast<void*>(ptr); }
cudaStream_t to_cuda(Stream s) noexcept { return reinterpret_cast<cudaStream_t>(s.handle); }
cudaEvent_t to_cuda(Event e) noexcept { return reinterpret_cast<cudaEvent_t>(e.handle); }

// The driver functions this backend uses; a null member was not found.
struct DriverApi {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;  // runtime ordinal -> CUdevice
  PFN_cuDevicePrimaryCtxGetState_v7000 primary_ctx_get_state = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  std::string missing;  // the symbols not found, ", "-separated

  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
  std::string error_text(CUresult status) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (get_error_name == nullptr || get_error_name(status, &name) != CUDA_SUCCESS ||
        get_error_string == nullptr || get_error_string(status, &text) != CUDA_SUCCESS) {
      return detail::concat("CUresult ", static_cast<int>(status));
    }
    return detail::concat(name, " (", text, ")");
  }
};

template <typename Fn>
void look_up(const char* symbol, Fn& fn, std::string& missing) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status = cudaGetDriverEntryPointByVersion(symbol, &address, kDriverAbiVersion,
                                                              cudaEnableDefault, &found);
  if (status == cudaSuccess && found == cudaDriverEntryPointSuccess && address != nullptr) {
    fn = reinterpret_cast<Fn>(address);
    return;
  }
  clear_if_last(status);
  fn = nullptr;
  missing += missing.empty() ? symbol : detail::concat(", ", symbol);
}

DriverApi load_driver_api() {
  DriverApi api;
  look_up("cuGetErrorName", api.get_error_name, api.missing);
  look_up("cuGetErrorString", api.get_error_string, api.missing);
  look_up("cuCtxGetCurrent", api.ctx_get_current, api.missing);
  look_up("cuDeviceGet", api.device_get, api.missing);
  look_up("cuDevicePrimaryCtxGetState", api.primary_ctx_get_state, api.missing);
  look_up("cuDeviceGetAttribute", api.device_get_attribute, api.missing);
  look_up("cuMemGetAllocationGranularity", api.mem_get_allocation_granularity, api.missing);
  look_up("cuMemAddressReserve", api.mem_address_reserve, api.missing);
  look_up("cuMemAddressFree", api.mem_address_free, api.missing);
  look_up("cuMemCreate", api.mem_create, api.missing);
  look_up("cuMemRelease", api.mem_release, api.missing);
  look_up("cuMemMap", api.mem_map, api.missing);
  look_up("cuMemUnmap", api.mem_unmap, api.missing);
  look_up("cuMemSetAccess", api.mem_set_access, api.missing);
  return api;
}

// Makes a device current on the calling thread for the guard's lifetime, and gives the thread
// its previous device back afterwards. With `needs_context`, also makes sure a context is
// current, which the runtime binds lazily but driver calls require: a thread that has made no
// CUDA call yet has none.
class DeviceGuard {
 public:
  DeviceGuard(int device, const DriverApi& driver, bool needs_context)
      : device_(device), driver_(driver) {
    STOWAGE_CUDART_CHECK(device_, cudaGetDevice(&previous_));
    if (previous_ != device_) {
      STOWAGE_CUDART_CHECK(device_, cudaSetDevice(device_));  // binds the primary context too
      restore_ = true;
    } else if (needs_context && !has_context()) {
      STOWAGE_CUDART_CHECK(device_, cudaSetDevice(device_));
      if (!has_context()) {
        STOWAGE_CUDART_CHECK(device_, cudaFree(nullptr));  // the runtime's lazy binding
      }
    }
  }

  ~DeviceGuard() {
    // Setting a device whose primary context is not active would create one (hundreds of MiB of
    // device memory) on a device this thread never used; leave the thread on device_ instead.
    if (restore_ && primary_context_active(previous_)) {
      clear_if_last(cudaSetDevice(previous_));
    }
  }

  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  // Both answer true when they cannot tell: the guard then acts as a plain runtime guard.
  bool has_context() const noexcept {
    CUcontext context = nullptr;
    return driver_.ctx_get_current == nullptr ||
           driver_.ctx_get_current(&context) != CUDA_SUCCESS || context != nullptr;
  }

  bool primary_context_active(int ordinal) const noexcept {
    CUdevice device = 0;
    unsigned int flags = 0;
    int active = 0;
    return driver_.device_get == nullptr || driver_.primary_ctx_get_state == nullptr ||
           driver_.device_get(&device, ordinal) != CUDA_SUCCESS ||
           driver_.primary_ctx_get_state(device, &flags, &active) != CUDA_SUCCESS || active != 0;
  }

  const int device_;
  const DriverApi& driver_;
  int previous_ = -1;
  bool restore_ = false;
};

// cudaStreamIsCapturing in cudaStreamCaptureModeRelaxed (a global-mode capture on another thread
// cannot object), then the thread's own mode back. Clears the runtime's last error it set.
cudaError_t capture_status(cudaStream_t stream, cudaStreamCaptureStatus& capture) noexcept {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t status = cudaThreadExchangeStreamCaptureMode(&mode);
  if (status == cudaSuccess) {
    status = cudaStreamIsCapturing(stream, &capture);
    clear_if_last(cudaThreadExchangeStreamCaptureMode(&mode));  // back to the thread's mode
  }
  clear_if_last(status);
  return status;
}

// Runs and deletes a function given to enqueue_host_function. CUDA calls it exactly once.
void CUDART_CB run_host_function(void* data) noexcept {
  const std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(data));
  try {
    (*fn)();
  } catch (...) {
    // The contract forbids throwing; a throw here cannot reach anyone, so it is reported.
    std::fputs("stowage: a host function enqueued on a CUDA stream threw; ignored\n", stderr);
  }
}

// Lets the calling thread make calls that a CUDA graph capture in the default (global) mode
// forbids, such as cudaMalloc and the VMM calls, for the guard's lifetime; the thread's
// previous mode comes back afterwards. A capture under way records none of these calls, so
// memory obtained while one runs is plain device memory (as in torch's own allocator).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { clear_if_last(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCaptureMode() { clear_if_last(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// The CUDA device behind open_cuda_device (contract in cuda_backend.hpp). The state that
// CUDA calls need, besides CUDA's own: the device's ordinals, the driver's entry points, its
// properties, and the table of the streams and events this backend created.
class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int device_index) {
    STOWAGE_CHECK(device_index >= 0, "CUDA device ", device_index, " does not exist");
    int count = 0;
    STOWAGE_CUDART_CHECK(device_index, cudaGetDeviceCount(&count));
    STOWAGE_CHECK(device_index < count, "CUDA device ", device_index,
                  " does not exist: CUDA reports ", count, " device(s)");
    device_ = device_index;
    driver_ = load_driver_api();

    const DeviceGuard guard = device_guard(/*needs_context=*/true);
    STOWAGE_CUDART_CHECK(device_index, cudaFree(nullptr));  // the primary context exists from here
    cudaDeviceProp device_properties{};
    STOWAGE_CUDART_CHECK(device_index, cudaGetDeviceProperties(&device_properties, device_index));
    char pci_bus_id[32] = {};  // "0000:17:00.0"
    STOWAGE_CUDART_CHECK(device_index, cudaDeviceGetPCIBusId(pci_bus_id, 32, device_index));
    properties_.name = device_properties.name;
    properties_.device_index = device_index;
    properties_.total_bytes = device_properties.totalGlobalMem;
    properties_.pci_bus_id = pci_bus_id;
    no_vmm_reason_ = probe_virtual_memory();
    properties_.virtual_memory = no_vmm_reason_.empty();
  }

  ~CudaBackend() override {
    std::unordered_set<std::uintptr_t> streams;
    std::unordered_set<std::uintptr_t> events;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      streams.swap(streams_);
      events.swap(events_);
    }
    if (streams.empty() && events.empty()) {
      return;
    }
    try {
      const DeviceGuard guard = device_guard();
      for (const std::uintptr_t stream : streams) {
        clear_if_last(cudaStreamSynchronize(to_cuda(Stream{stream})));
        clear_if_last(cudaStreamDestroy(to_cuda(Stream{stream})));
      }
      for (const std::uintptr_t event : events) {
        clear_if_last(cudaEventDestroy(to_cuda(Event{event})));
      }
    } catch (...) {
      // No device to switch to (the runtime is shutting down): nothing left to release.
    }
  }

  // --- properties ---
  const DeviceProperties& properties() const noexcept override { return properties_; }

  MemoryInfo memory_info() override {
    const DeviceGuard guard = device_guard();
    MemoryInfo info;
    STOWAGE_CUDART_CHECK(device_, cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
    return info;
  }

  // --- segments ---
  void* try_allocate_segment(std::size_t bytes) override {
    STOWAGE_CHECK(bytes > 0, "cannot allocate an empty segment");
    const DeviceGuard guard = device_guard();
    const RelaxedCaptureMode relaxed;
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      clear_if_last(status);
      return nullptr;
    }
    STOWAGE_CUDART_THROW_IF(device_, status, detail::concat("cudaMalloc(", bytes, " bytes)"));
    return ptr;
  }

  void free_segment(void* ptr) override {
    STOWAGE_CHECK(ptr != nullptr, "free_segment(nullptr)");
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaFree(ptr));
  }

  // --- virtual memory ---
  void* reserve_address_range(std::size_t bytes, std::size_t alignment = 0) override {
    const DeviceGuard guard = vmm_guard();
    const RelaxedCaptureMode relaxed;
    CUdeviceptr base = 0;
    STOWAGE_CU_CHECK(*this, driver_.mem_address_reserve(&base, bytes, alignment, 0, 0),
                     "cuMemAddressReserve(", bytes, " bytes, alignment ", alignment, ")");
    return to_pointer(base);
  }

  void release_address_range(void* base, std::size_t bytes) override {
    const DeviceGuard guard = vmm_guard();
    STOWAGE_CU_CHECK(*this, driver_.mem_address_free(to_cu(base), bytes),
                     "cuMemAddressFree(", base, ", ", bytes, " bytes)");
  }

  std::optional<PhysicalHandle> try_create_physical(std::size_t bytes) override {
    const DeviceGuard guard = vmm_guard();
    const RelaxedCaptureMode relaxed;
    CUmemGenericAllocationHandle handle = 0;
    const CUresult status = driver_.mem_create(&handle, bytes, &allocation_, 0);
    if (status == CUDA_ERROR_OUT_OF_MEMORY) {
      return std::nullopt;
    }
    STOWAGE_CU_CHECK(*this, status, "cuMemCreate(", bytes, " bytes)");
    return PhysicalHandle{handle};
  }

  void release_physical(PhysicalHandle handle) override {
    const DeviceGuard guard = vmm_guard();
    STOWAGE_CU_CHECK(*this, driver_.mem_release(handle.value), "cuMemRelease(handle 0x",
                     std::hex, handle.value, std::dec, ")");
  }

  void map(void* address, std::size_t bytes, PhysicalHandle handle,
                      std::size_t handle_offset = 0) override {
    const DeviceGuard guard = vmm_guard();
    const RelaxedCaptureMode relaxed;
    STOWAGE_CU_CHECK(*this,
                     driver_.mem_map(to_cu(address), bytes, handle_offset, handle.value, 0),
                     "cuMemMap(", address, ", ", bytes, " bytes, offset ", handle_offset,
                     ", handle 0x", std::hex, handle.value, std::dec, ")");
  }

  void set_access(void* address, std::size_t bytes) override {
    const DeviceGuard guard = vmm_guard();
    const RelaxedCaptureMode relaxed;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = cu_device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    STOWAGE_CU_CHECK(*this, driver_.mem_set_access(to_cu(address), bytes, &access, 1),
                     "cuMemSetAccess(", address, ", ", bytes, " bytes, read-write)");
  }

  void unmap(void* address, std::size_t bytes) override {
    const DeviceGuard guard = vmm_guard();
    STOWAGE_CU_CHECK(*this, driver_.mem_unmap(to_cu(address), bytes), "cuMemUnmap(",
                     address, ", ", bytes, " bytes)");
  }

  // --- streams and events ---
  Stream create_stream() override {
    return Stream{create_owned(streams_, &cudaStreamCreateWithFlags, cudaStreamNonBlocking,
                               &cudaStreamDestroy, "cudaStreamCreateWithFlags")};
  }

  void destroy_stream(Stream stream) override {
    STOWAGE_CHECK(stream.handle != 0, "the default stream cannot be destroyed");
    check_known(streams_, stream.handle, "Stream", /*erase=*/true);
    const DeviceGuard guard = device_guard();
    // Destroy even when the wait fails, so the stream never leaks; report the first failure.
    const cudaError_t synchronized = cudaStreamSynchronize(to_cuda(stream));
    const cudaError_t destroyed = cudaStreamDestroy(to_cuda(stream));
    STOWAGE_CUDART_THROW_IF(device_, synchronized, "cudaStreamSynchronize");
    STOWAGE_CUDART_THROW_IF(device_, destroyed, "cudaStreamDestroy");
  }

  void synchronize_stream(Stream stream) override {
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaStreamSynchronize(to_cuda(stream)));
  }

  void synchronize_device() override {
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaDeviceSynchronize());
  }

  Event create_event() override {
    return Event{create_owned(events_, &cudaEventCreateWithFlags, cudaEventDisableTiming,
                              &cudaEventDestroy, "cudaEventCreateWithFlags")};
  }

  void destroy_event(Event event) override {
    check_known(events_, event.handle, "Event", /*erase=*/true);
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaEventDestroy(to_cuda(event)));
  }

  void record_event(Event event, Stream stream) override {
    check_known(events_, event.handle, "Event");
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaEventRecord(to_cuda(event), to_cuda(stream)));
  }

  bool query_event(Event event) override {
    check_known(events_, event.handle, "Event");
    const DeviceGuard guard = device_guard();
    const cudaError_t status = cudaEventQuery(to_cuda(event));
    if (status == cudaErrorNotReady) {
      clear_if_last(status);  // not a failure: PyTorch's launch checks must not see it
      return false;
    }
    STOWAGE_CUDART_THROW_IF(device_, status, "cudaEventQuery");
    return true;
  }

  void synchronize_event(Event event) override {
    check_known(events_, event.handle, "Event");
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaEventSynchronize(to_cuda(event)));
  }

  void stream_wait_event(Stream stream, Event event) override {
    check_known(events_, event.handle, "Event");
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_,
                         cudaStreamWaitEvent(to_cuda(stream), to_cuda(event), cudaEventWaitDefault));
  }

  Event create_timing_event() override {
    return Event{create_owned(events_, &cudaEventCreateWithFlags, cudaEventDefault,
                              &cudaEventDestroy, "cudaEventCreateWithFlags")};
  }

  double elapsed_seconds(Event start, Event end) override {
    check_known(events_, start.handle, "Event");
    check_known(events_, end.handle, "Event");
    const DeviceGuard guard = device_guard();
    float milliseconds = 0;
    const cudaError_t status = cudaEventElapsedTime(&milliseconds, to_cuda(start), to_cuda(end));
    if (status == cudaErrorNotReady || status == cudaErrorInvalidResourceHandle) {
      clear_if_last(status);
      STOWAGE_THROW(LogicError, "elapsed_seconds needs two timing events whose recordings "
                    "have completed (", cudaGetErrorString(status), ")");
    }
    STOWAGE_CUDART_THROW_IF(device_, status, "cudaEventElapsedTime");
    return static_cast<double>(milliseconds) / 1000.0;
  }

  // --- work on streams ---
  void copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_,
                         cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, to_cuda(stream)));
  }

  void memset_async(void* dst, int value, std::size_t bytes, Stream stream) override {
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaMemsetAsync(dst, value, bytes, to_cuda(stream)));
  }

  void enqueue_host_function(Stream stream, std::function<void()> fn) override {
    STOWAGE_CHECK(static_cast<bool>(fn), "enqueue_host_function needs a function");
    auto owned = std::make_unique<std::function<void()>>(std::move(fn));
    const DeviceGuard guard = device_guard();
    // Under graph capture the function would become a graph node run at every replay, while
    // run_host_function deletes it after the first: refuse. The legacy Stream{0} answers
    // cudaErrorStreamCaptureImplicit while a blocking stream captures (the capture survives the
    // query, not a launch): refuse too.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const cudaError_t status = capture_status(to_cuda(stream), capture);
    STOWAGE_CHECK(status != cudaErrorStreamCaptureImplicit,
                  "enqueue_host_function on legacy Stream{0} during a blocking stream's capture");
    STOWAGE_CUDART_THROW_IF(device_, status, "cudaStreamIsCapturing");
    STOWAGE_CHECK(capture == cudaStreamCaptureStatusNone,
                  "enqueue_host_function on a stream under CUDA graph capture");
    STOWAGE_CUDART_CHECK(device_,
                         cudaLaunchHostFunc(to_cuda(stream), &run_host_function, owned.get()));
    static_cast<void>(owned.release());  // run_host_function deletes it
  }

  // --- pinned host memory ---
  void* try_allocate_pinned(std::size_t bytes) override {
    STOWAGE_CHECK(bytes > 0, "cannot allocate an empty pinned buffer");
    const DeviceGuard guard = device_guard();
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
    if (status == cudaErrorMemoryAllocation) {
      clear_if_last(status);
      return nullptr;
    }
    STOWAGE_CUDART_THROW_IF(device_, status,
                            detail::concat("cudaHostAlloc(", bytes, " bytes)"));
    return ptr;
  }

  void free_pinned(void* ptr) override {
    STOWAGE_CHECK(ptr != nullptr, "free_pinned(nullptr)");
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaFreeHost(ptr));
  }

  bool try_register_host(void* ptr, std::size_t bytes) override {
    STOWAGE_CHECK(ptr != nullptr && bytes > 0, "register_host needs memory to pin");
    const DeviceGuard guard = device_guard();
    const cudaError_t status = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (status == cudaErrorMemoryAllocation) {
      clear_if_last(status);
      return false;
    }
    if (status == cudaErrorHostMemoryAlreadyRegistered) {
      clear_if_last(status);
      STOWAGE_THROW(LogicError, "host memory at ", ptr, " is pinned already");
    }
    STOWAGE_CUDART_THROW_IF(device_, status,
                            detail::concat("cudaHostRegister(", ptr, ", ", bytes, " bytes)"));
    return true;
  }

  void unregister_host(void* ptr) override {
    STOWAGE_CHECK(ptr != nullptr, "unregister_host(nullptr)");
    const DeviceGuard guard = device_guard();
    STOWAGE_CUDART_CHECK(device_, cudaHostUnregister(ptr));
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

 private:
  DeviceGuard device_guard(bool needs_context = false) const {
    return DeviceGuard(device_, driver_, needs_context);
  }

  // Throws BackendError unless the VMM calls are usable; returns a guard with a context.
  DeviceGuard vmm_guard() const {
    if (!properties_.virtual_memory) {
      STOWAGE_THROW(BackendError, "virtual memory is not available on CUDA device ", device_, ": ",
                    no_vmm_reason_);
    }
    return device_guard(/*needs_context=*/true);
  }

  // Creates a stream or event with the runtime's `create` (named `what` in errors) and adds it to
  // its table; if that fails, destroys it with `destroy`.
  template <typename Native>
  std::uintptr_t create_owned(std::unordered_set<std::uintptr_t>& table,
                              cudaError_t (*create)(Native*, unsigned int), unsigned int flags,
                              cudaError_t (*destroy)(Native), const char* what) {
    const DeviceGuard guard = device_guard();
    Native native = nullptr;
    STOWAGE_CUDART_THROW_IF(device_, create(&native, flags), what);
    const auto handle = reinterpret_cast<std::uintptr_t>(native);
    try {
      const std::lock_guard<std::mutex> lock(mutex_);
      table.insert(handle);
    } catch (...) {
      clear_if_last(destroy(native));
      throw;
    }
    return handle;
  }

  // Throws LogicError unless `handle` is in the table (created here and not destroyed yet);
  // with `erase`, also takes it out, so two racing destroys cannot both pass.
  void check_known(std::unordered_set<std::uintptr_t>& table, std::uintptr_t handle,
                   const char* what, bool erase = false) {
    STOWAGE_CHECK(handle != 0, what, "{0} is not valid here");
    const std::lock_guard<std::mutex> lock(mutex_);
    const bool known = erase ? table.erase(handle) != 0 : table.count(handle) != 0;
    STOWAGE_CHECK(known, what, " 0x", std::hex, handle, std::dec,
                  " was not created by this backend, or was destroyed");
  }

  // Fills cu_device_, `allocation_` and properties_.granularity; returns why VMM is unusable, or
  // "". Needs a current context.
  std::string probe_virtual_memory() {
    if (!driver_.missing.empty()) {
      return "the driver lacks " + driver_.missing;
    }
    if (const CUresult got = driver_.device_get(&cu_device_, device_); got != CUDA_SUCCESS) {
      return "cuDeviceGet failed: " + driver_.error_text(got);
    }
    int supported = 0;
    const CUresult status = driver_.device_get_attribute(
        &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device_);
    if (status != CUDA_SUCCESS || supported == 0) {
      return status != CUDA_SUCCESS ? "cuDeviceGetAttribute failed: " + driver_.error_text(status)
                                    : "the device does not support virtual memory management";
    }
    allocation_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    allocation_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    allocation_.location.id = cu_device_;
    const CUresult queried = driver_.mem_get_allocation_granularity(
        &properties_.granularity, &allocation_, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (queried != CUDA_SUCCESS || properties_.granularity == 0) {
      properties_.granularity = 0;
      return "cuMemGetAllocationGranularity failed: " + driver_.error_text(queried);
    }
    return "";
  }

  int device_ = 0;          // the runtime ordinal, for runtime calls
  CUdevice cu_device_ = 0;  // the driver's device of that ordinal, for driver calls
  DriverApi driver_;
  DeviceProperties properties_;
  std::string no_vmm_reason_;          // why properties_.virtual_memory is false; else empty
  CUmemAllocationProp allocation_{};   // pinned memory on the device, for cuMemCreate

  std::mutex mutex_;  // guards the two tables below
  std::unordered_set<std::uintptr_t> streams_;  // created here and not destroyed yet
  std::unordered_set<std::uintptr_t> events_;   // likewise
};

}  // namespace

int cuda_device_count() noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  clear_if_last(status);
  return status == cudaSuccess ? count : 0;
}

std::unique_ptr<DeviceBackend> open_cuda_device(int device_index) {
  return std::make_unique<CudaBackend>(device_index);
}

}  // namespace stowage
