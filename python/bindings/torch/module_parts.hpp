// The parts of stowage._torch bound in files of their own.
#pragma once

#include <pybind11/pybind11.h>

namespace stowage::python {

// stowage.offload's C++ side: the saved-tensor pager and the offload engines.
void bind_offload(pybind11::module_& module);
// The offloaded optimizer's host update and host memory.
void bind_optimizer(pybind11::module_& module);

}  // namespace stowage::python
