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
#include "offload/offload_summary.hpp"
#include "python/bindings/bindings.hpp"
#include "snapshot/tag_book.hpp"

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
  module.def("offload_summary_lines", &stowage::offload::offload_summary_lines, py::arg("stats"),
             "The offload engine's statistics as memory_summary's lines (offload/offload_summary.hpp); none "
             "before anything was offloaded.");
  module.def("memory_summary_title", &stowage::memory_summary_title, py::arg("device"), py::arg("capacity"),
             "The summary's title for CUDA device `device`, or CPU mode's simulated device (-1), of `capacity` bytes.");
  py::class_<stowage::ResolvedTags>(module, "ResolvedTags",
                                    "The allocations something is known about (indices), their categories "
                                    "(-1: none) and module path ids (0: none).")
      .def_readonly("allocation", &stowage::ResolvedTags::allocation)
      .def_readonly("category", &stowage::ResolvedTags::category)
      .def_readonly("module", &stowage::ResolvedTags::module);
  py::class_<stowage::TagBook>(module, "TagBook",
                                "One recording's notes and module spans, bounded, resolved at a snapshot "
                                "(snapshot/tag_book.hpp).")
      .def(py::init<std::int64_t>(), py::arg("max_entries"))
      .def("own", &stowage::TagBook::own, py::arg("paths"), py::arg("keys"))
      .def("note", &stowage::TagBook::note, py::arg("position"), py::arg("addresses"), py::arg("category"),
           py::arg("owner_keys"))
      .def("enter", &stowage::TagBook::enter, py::arg("position"), py::arg("path"), py::arg("type_name"))
      .def("leave", &stowage::TagBook::leave, py::arg("position"))
      .def_property_readonly("in_forward", &stowage::TagBook::in_forward)
      .def_property_readonly(
          "paths",
          [](const stowage::TagBook& book) {
            py::list paths;  // bytes: a module path may hold lone surrogates, passed as UTF-8 by surrogatepass
            for (const std::string& path : book.paths()) paths.append(py::bytes(path));
            return paths;
          },
          "The module paths by id, as the UTF-8 bytes `own` and `enter` were given.")
      .def("resolve", &stowage::TagBook::resolve, py::arg("positions"), py::arg("addresses"),
           py::arg("num_categories"));
  stowage::python::bind_planner(module);
  stowage::python::bind_batches(module);
  stowage::python::bind_plan_files(module);
  stowage::python::bind_replay(module);
  stowage::python::bind_snapshot(module);
  stowage::python::bind_topology(module);
}
