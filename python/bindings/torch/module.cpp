// stowage._torch: the parts of stowage that live inside PyTorch: CPU mode, stowage as torch's
// CUDA allocator (when built with CUDA for a supported torch), and the memory API behind both.
// Memory functions take a device: -1 for CPU mode, else a CUDA device index.
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstddef>
#include <exception>
#include <optional>
#include <string>

#include "allocator/stats.hpp"
#include "base/errors.hpp"
#include "python/tensors/cpu_allocator.hpp"
#include "python/bindings/torch/module_parts.hpp"
#include "python/bindings/torch/snapshot_dict.hpp"
#include "python/tensors/stack_table.hpp"

#ifdef STOWAGE_TORCH_CUDA
#include "allocator/process/c_api.h"
#include "allocator/process/cuda_allocators.hpp"
#include "python/libtorch/cuda_allocator.hpp"
#endif

namespace py = pybind11;

namespace {

using stowage::CachingAllocator;
namespace cpu = stowage::torch_cpu;

constexpr int kCpu = -1;

cpu::StackTable& stacks() { return cpu::stack_table(); }

CachingAllocator& allocator_for(int device) {
  if (device == kCpu) {
    CachingAllocator* allocator = cpu::allocator();
    STOWAGE_CHECK(allocator != nullptr, "stowage is not enabled: call stowage.enable(device='cpu', "
                  "capacity=...) first");
    return *allocator;
  }
#ifdef STOWAGE_TORCH_CUDA
  if (stowage::torch_cuda::is_enabled()) return stowage::cuda_allocators::get(device);
  // Through the C library (torch's CUDAPluggableAllocator over libstowage.so) the allocators
  // exist once a device has been used.
  CachingAllocator* allocator = stowage::cuda_allocators::find(device);
  STOWAGE_CHECK(allocator != nullptr, "stowage is not torch's CUDA allocator (call "
                "stowage.enable() or set STOWAGE_ALLOC_CONF first), and its C library has "
                "allocated nothing on CUDA device ", device);
  return *allocator;
#else
  STOWAGE_CHECK(false, "this build of stowage has no CUDA integration (device ", device, ")");
  return *cpu::allocator();
#endif
}

// CPU mode: stowage as torch's CPU allocator.
void bind_cpu_mode(py::module_& module) {
  module.def(
      "enable_cpu",
      [](std::size_t capacity, const std::string& config, double copy_bytes_per_second,
         std::size_t pinned_bytes) {
        cpu::enable({capacity, config, copy_bytes_per_second, pinned_bytes});
      },
      py::arg("capacity"), py::arg("config") = "", py::arg("copy_bytes_per_second") = 0.0,
      py::arg("pinned_bytes") = 0);
  module.def("disable_cpu", &cpu::disable);
  module.def("is_enabled", &cpu::is_enabled);
  module.def("was_enabled", [] { return cpu::allocator() != nullptr; });
  module.def("cpu_owns", [](const at::Tensor& tensor) { return tensor.has_storage() && cpu::owns(tensor.storage()); },
             py::arg("tensor"), "Whether CPU mode's allocator made the tensor's storage.");
}

// stowage as torch's CUDA allocator, and the C library beside it.
void bind_cuda(py::module_& module) {
#ifdef STOWAGE_TORCH_CUDA
  module.attr("has_cuda") = true;
  module.attr("cuda_torch_versions") = stowage::torch_cuda::supported_torch_versions();
  module.def("enable_cuda", &stowage::torch_cuda::enable, py::arg("config") = "");
  module.def("cuda_enabled", &stowage::torch_cuda::is_enabled);
  // Whether stowage serves CUDA memory through the C library instead (torch's
  // CUDAPluggableAllocator over libstowage.so): allocators exist, torch's allocator is another.
  module.def("cuda_library_in_use", [] {
    bool any = false;
    stowage::cuda_allocators::for_each([&](int, CachingAllocator&) { any = true; });
    return any && !stowage::torch_cuda::is_enabled();
  });
  // Every CUDA allocator's empty_cache (torch's pluggable allocator has no reset hook unless
  // one is set, so torch.cuda.empty_cache() may not reach the C library's allocators).
  module.def("empty_cuda_caches", [] {
    stowage::cuda_allocators::for_each(
        [](int, CachingAllocator& allocator) { allocator.empty_cache(); });
  });
  module.def("cuda_configuration", &stowage::cuda_allocators::configuration);
  module.def("c_library_path", [] {
    Dl_info info{};
    STOWAGE_CHECK(::dladdr(reinterpret_cast<void*>(&stowage_malloc), &info) != 0 &&
                      info.dli_fname != nullptr,
                  "cannot find where libstowage.so was loaded from");
    return std::string(info.dli_fname);
  });
#else
  module.attr("has_cuda") = false;
  module.attr("cuda_torch_versions") = "";
  module.def("cuda_enabled", [] { return false; });
  module.def("cuda_library_in_use", [] { return false; });
#endif
}

// stowage.placement_status(): learned placement's state.
py::dict to_dict(const CachingAllocator::PlacementStatus& status) {
  py::dict out;
  out["enabled"] = status.enabled;
  out["phase"] = status.phase == stowage::StepLearner::Phase::kLearning  ? "learning"
                 : status.phase == stowage::StepLearner::Phase::kPlaced ? "placed"
                                                                         : "off";
  out["layouts_made"] = status.layouts_made;
  out["departures"] = status.departures;
  out["arena_bytes"] = status.arena_bytes;
  out["layout_live_bytes"] = status.layout_live_bytes;
  out["placed_allocations"] = status.placed_allocations;
  return out;
}

// torch's memory API over any of stowage's allocators (kCpu: CPU mode's; else a CUDA device's).
void bind_memory_api(py::module_& module) {
  module.def("memory_stats", [](int device) {
    py::dict out;
    for (const auto& [key, value] : stowage::memory_stats_entries(allocator_for(device).stats())) {
      out[py::str(key)] = value;
    }
    return out;
  }, py::arg("device") = kCpu);
  module.def("reset_peak_stats", [](int device) { allocator_for(device).reset_peak_stats(); },
             py::arg("device") = kCpu);
  module.def("reset_accumulated_stats",
             [](int device) { allocator_for(device).reset_accumulated_stats(); },
             py::arg("device") = kCpu);
  module.def("empty_cache", [](int device) { allocator_for(device).empty_cache(); },
             py::arg("device") = kCpu);
  module.def("mark_fit_trial", [](bool begin, int device) { allocator_for(device).mark_fit_trial(begin); },
             py::arg("begin"), py::arg("device") = kCpu,
             "Marks in the device's history where stowage.fit's trial steps begin or end.");
  // Every allocator stowage runs in this process: the CPU one and each CUDA device's.
  module.def("mark_step", [] {
    if (CachingAllocator* allocator = cpu::allocator(); allocator != nullptr) allocator->mark_step();
#ifdef STOWAGE_TORCH_CUDA
    stowage::cuda_allocators::for_each(
        [](int, CachingAllocator& allocator) { allocator.mark_step(); });
#endif
  });
  module.def("placement_status",
             [](int device) { return to_dict(allocator_for(device).placement_status()); },
             py::arg("device") = kCpu);
  // Note [Allocated ceiling]; None: no ceiling.
  module.def(
      "set_allocated_ceiling",
      [](std::optional<std::size_t> bytes, int device) {
        allocator_for(device).set_allocated_ceiling(bytes.value_or(CachingAllocator::kNoCeiling));
      },
      py::arg("bytes"), py::arg("device") = kCpu);
  module.def("allocated_ceiling", [](int device) -> std::optional<std::size_t> {
    const std::size_t ceiling = allocator_for(device).allocated_ceiling();
    if (ceiling == CachingAllocator::kNoCeiling) return std::nullopt;
    return ceiling;
  }, py::arg("device") = kCpu);
  module.def("capacity",
             [](int device) { return allocator_for(device).backend().properties().total_bytes; },
             py::arg("device") = kCpu);
  // The most the device's allocator may reserve: the smallest of the device's memory, the
  // allocator's limit and memory fraction (torch's per-process fraction sets the latter), and
  // which of them that is.
  module.def("memory_cap", [](int device) {
    const CachingAllocator& allocator = allocator_for(device);
    return py::make_tuple(allocator.limit(), allocator.limit_bound());
  }, py::arg("device") = kCpu);
  module.def(
      "record_history",
      [](bool enabled, const std::string& stacks_kind, std::size_t max_entries, int device) {
        STOWAGE_CHECK(stacks_kind == "python" || stacks_kind == "all",
                      "stacks must be 'python' or 'all', not '", stacks_kind, "'");
        // Stacks are gathered for CPU mode; a CUDA device's allocator here is the C library's,
        // which records its events without them.
        if (device == kCpu) stacks().configure(true, stacks_kind == "all");
        allocator_for(device).record_history(enabled, max_entries);
      },
      py::arg("enabled"), py::arg("stacks") = "python", py::arg("max_entries") = 100000,
      py::arg("device") = kCpu);
  // The snapshot and History::recorded() at its taking (Python resolves stowage.tagging's tags
  // with it and does not write it).
  module.def("snapshot", [](int device) {
    CachingAllocator& allocator = allocator_for(device);
    const stowage::AllocatorSnapshot taken = allocator.snapshot();
    py::dict out = stowage::python::snapshot_dict(taken, stacks(), allocator.config().to_string());
    return py::make_tuple(out, taken.trace_recorded);
  }, py::arg("device") = kCpu);
  module.def("history_recorded", [](int device) { return allocator_for(device).history_recorded(); },
             py::arg("device") = kCpu, "Events the device's history has recorded since it was turned on.");
}

}  // namespace

PYBIND11_MODULE(_torch, module) {
  module.doc() = "stowage inside PyTorch: CPU mode, the CUDA allocator, and the memory API";
  py::register_exception<stowage::LogicError>(module, "LogicError", PyExc_ValueError);
  // Note [Bounded waits]: a wait past its deadline is a TimeoutError naming what it waited for;
  // one the user interrupted is the KeyboardInterrupt Python's own handler noted (raised here, so
  // that it is not raised a second time at the next bytecode).
  py::register_exception<stowage::WaitTimeout>(module, "WaitTimeout", PyExc_TimeoutError);
  py::register_exception_translator([](std::exception_ptr raised) {
    try {
      if (raised) std::rethrow_exception(raised);
    } catch (const stowage::Interrupted& error) {
      if (PyErr_CheckSignals() != 0) return;  // Python's handler raised KeyboardInterrupt
      PyErr_SetString(PyExc_KeyboardInterrupt, error.message().c_str());
    }
  });
  // torch's allocator interfaces change between releases: the Python side refuses to use this
  // module under any other torch than the one it was compiled against.
  module.attr("built_for_torch") = STOWAGE_BUILT_FOR_TORCH;
  bind_cpu_mode(module);
  bind_cuda(module);
  bind_memory_api(module);
  stowage::python::bind_offload(module);
  stowage::python::bind_optimizer(module);
  stowage::python::bind_adam_state_check(module);
  stowage::python::bind_adam_slots(module);
  stowage::python::bind_parameters(module);
}
