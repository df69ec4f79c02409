// stowage._torch: the parts of stowage that live inside PyTorch (CPU mode now; the CUDA
// integration later). Built only where torch is found; links only torch's libc10.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "allocator/errors.hpp"
#include "allocator/stats.hpp"
#include "python/src/torch/cpu_allocator.hpp"
#include "python/src/torch/snapshot_dict.hpp"
#include "python/src/torch/stack_table.hpp"

namespace py = pybind11;

namespace {

using stowage::CachingAllocator;
namespace cpu = stowage::torch_cpu;

cpu::StackTable& stacks() { return cpu::stack_table(); }

CachingAllocator& enabled_allocator() {
  CachingAllocator* allocator = cpu::allocator();
  STOWAGE_CHECK(allocator != nullptr, "stowage is not enabled: call stowage.enable(device='cpu', "
                "capacity=...) first");
  return *allocator;
}

}  // namespace

PYBIND11_MODULE(_torch, module) {
  module.doc() = "stowage inside PyTorch: CPU mode and the memory API behind it";
  py::register_exception<stowage::LogicError>(module, "LogicError", PyExc_ValueError);
  // c10::Allocator's layout can change between torch releases: the Python side refuses to use
  // this module under any other torch than the one it was compiled against.
  module.attr("built_for_torch") = STOWAGE_BUILT_FOR_TORCH;

  module.def(
      "enable_cpu",
      [](std::size_t capacity, const std::string& config) {
        cpu::enable(capacity, config);
      },
      py::arg("capacity"), py::arg("config") = "");
  module.def("disable_cpu", &cpu::disable);
  module.def("is_enabled", &cpu::is_enabled);
  module.def("was_enabled", [] { return cpu::allocator() != nullptr; });
  module.def("memory_stats", [] {
    py::dict out;
    for (const auto& [key, value] : stowage::memory_stats_entries(enabled_allocator().stats())) {
      out[py::str(key)] = value;
    }
    return out;
  });
  module.def("reset_peak_stats", [] { enabled_allocator().reset_peak_stats(); });
  module.def("reset_accumulated_stats", [] { enabled_allocator().reset_accumulated_stats(); });
  module.def("empty_cache", [] { enabled_allocator().empty_cache(); });
  module.def("capacity", [] { return enabled_allocator().backend().properties().total_bytes; });
  module.def(
      "record_history",
      [](bool enabled, const std::string& stacks_kind, std::size_t max_entries) {
        STOWAGE_CHECK(stacks_kind == "python" || stacks_kind == "all",
                      "stacks must be 'python' or 'all', not '", stacks_kind, "'");
        stacks().configure(true, stacks_kind == "all");
        enabled_allocator().record_history(enabled, max_entries);
      },
      py::arg("enabled"), py::arg("stacks") = "python", py::arg("max_entries") = 100000);
  module.def("snapshot", [] {
    return stowage::python::snapshot_dict(enabled_allocator().snapshot(), stacks(),
                                          enabled_allocator().config().to_string());
  });
}
