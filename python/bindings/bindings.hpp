// The parts of stowage._core, each bound in a file of its own.
#pragma once

#include <pybind11/pybind11.h>

namespace stowage::python {

void bind_planner(pybind11::module_& module);
void bind_batches(pybind11::module_& module);
void bind_plan_files(pybind11::module_& module);
void bind_replay(pybind11::module_& module);
void bind_snapshot(pybind11::module_& module);
void bind_trace_analysis(pybind11::module_& module);
void bind_topology(pybind11::module_& module);

}  // namespace stowage::python
