// stowage._core: the C++ core seen from Python. Thin: conversions only, no logic of its own.
// stowage's errors become Python exceptions: LogicError -> ValueError subclass, OutOfMemory ->
// MemoryError subclass, BackendError -> RuntimeError subclass, each with the C++ message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>

#include "allocator/base/bounded_wait.hpp"
#include "allocator/base/build_info.hpp"
#include "allocator/base/byte_units.hpp"
#include "allocator/base/errors.hpp"
#include "allocator/config.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, module) {
  module.doc() = "stowage's C++ core: configuration, byte units, trace replay, the planner and the snapshot reader";
  module.attr("__version__") = std::string(stowage::build_info::kVersion);
  py::register_exception<stowage::LogicError>(module, "LogicError", PyExc_ValueError);
  py::register_exception<stowage::OutOfMemory>(module, "OutOfMemory", PyExc_MemoryError);
  py::register_exception<stowage::BackendError>(module, "BackendError", PyExc_RuntimeError);
  // Note [Bounded waits]: the deadline's parts, for the Python side's waits (stowage.waiting).
  module.attr("wait_floor_bytes_per_second") = stowage::kFloorBytesPerSecond;
  module.attr("wait_slack_seconds") = std::chrono::duration<double>(stowage::kWaitSlack).count();

  module.def(
      "normalize_allocator_config",
      [](const std::string& text) { return stowage::parse_allocator_config(text).to_string(); },
      py::arg("text"),
      "Parses a 'key:value,key:value' allocator configuration and returns it normalised; "
      "raises LogicError naming a bad key or value.");
  module.def("parse_byte_size", &stowage::parse_byte_size, py::arg("text"),
             "'4GiB', '512 MiB', '1.5GB' or a plain number -> bytes.");
  module.def("format_bytes", &stowage::format_bytes, py::arg("bytes"), "bytes -> '1.50 GiB'.");
  stowage::python::bind_planner(module);
  stowage::python::bind_replay(module);
  stowage::python::bind_snapshot(module);
  stowage::python::bind_topology(module);
}
