// stowage._core: the C++ core seen from Python. Thin: conversions only, no logic of its own.
// stowage's errors become Python exceptions: LogicError -> ValueError subclass, OutOfMemory ->
// MemoryError subclass, BackendError -> RuntimeError subclass, each with the C++ message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "allocator/config.hpp"
#include "allocator/memory_summary.hpp"
#include "base/build_info.hpp"
#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "python/bindings/bindings.hpp"
#include "snapshot/tag_resolution.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, module) {
  module.doc() = "stowage's C++ core: configuration, byte units, trace replay, the planner and the snapshot reader";
  module.attr("__version__") = std::string(stowage::build_info::kVersion);
  py::register_exception<stowage::LogicError>(module, "LogicError", PyExc_ValueError);
  py::register_exception<stowage::OutOfMemory>(module, "OutOfMemory", PyExc_MemoryError);
  py::register_exception<stowage::BackendError>(module, "BackendError", PyExc_RuntimeError);

  module.def(
      "normalize_allocator_config",
      [](const std::string& text) { return stowage::parse_allocator_config(text).to_string(); },
      py::arg("text"),
      "Parses a 'key:value,key:value' allocator configuration and returns it normalised; "
      "raises LogicError naming a bad key or value.");
  module.def("parse_byte_size", &stowage::parse_byte_size, py::arg("text"),
             "'4GiB', '512 MiB', '1.5GB' or a plain number -> bytes.");
  module.def("format_bytes", &stowage::format_bytes, py::arg("bytes"), "bytes -> '1.50 GiB'.");
  module.def("memory_summary", &stowage::memory_summary, py::arg("stats"), py::arg("title"),
             py::arg("abbreviated"), py::arg("extra_lines"),
             "memory_stats()'s dict as torch.cuda.memory_summary()'s table, titled, with extra_lines "
             "boxed below; raises LogicError naming a missing key.");
  module.def("memory_summary_title", &stowage::memory_summary_title, py::arg("device"), py::arg("capacity"),
             "The summary's title for CUDA device `device`, or CPU mode's simulated device (-1), of `capacity` bytes.");
  py::class_<stowage::ResolvedTags>(module, "ResolvedTags",
                                    "The allocations something is known about (indices), their categories "
                                    "(-1: none) and module path ids (0: none).")
      .def_readonly("allocation", &stowage::ResolvedTags::allocation)
      .def_readonly("category", &stowage::ResolvedTags::category)
      .def_readonly("module", &stowage::ResolvedTags::module);
  module.def(
      "resolve_tags",
      [](const std::vector<std::int64_t>& positions, const std::vector<std::uint64_t>& addresses,
         const std::vector<std::tuple<std::int64_t, std::uint64_t, std::int64_t, std::int64_t>>& notes,
         const std::vector<stowage::ModuleSpan>& spans, std::int64_t num_categories) {
        std::vector<stowage::TagNote> rows;
        rows.reserve(notes.size());
        for (const auto& [position, address, category, owner] : notes) {
          rows.push_back({position, address, category, owner});
        }
        py::gil_scoped_release unlocked;
        return stowage::resolve_tags(positions, addresses, rows, spans, num_categories);
      },
      py::arg("positions"), py::arg("addresses"), py::arg("notes"), py::arg("spans"), py::arg("num_categories"),
      "stowage's notes (position, address, category, owner or -1) and module spans (begin, end or -1, "
      "path, parent or -1) resolved to the allocation events at `positions` / `addresses` "
      "(snapshot/tag_resolution.hpp).");
  stowage::python::bind_planner(module);
  stowage::python::bind_batches(module);
  stowage::python::bind_plan_files(module);
  stowage::python::bind_replay(module);
  stowage::python::bind_snapshot(module);
  stowage::python::bind_topology(module);
}
