// The parts of stowage._torch bound in files of their own.
#pragma once

#include <pybind11/pybind11.h>

namespace stowage::python {

// stowage.offload's C++ side: the saved-tensor offloader and the offload engines.
void bind_offload(pybind11::module_& module);
// The offloaded optimizer's host update and host memory.
void bind_optimizer(pybind11::module_& module);
// Checks of a saved Adam state_dict before the offloaded optimizer takes any of it.
void bind_adam_state_check(pybind11::module_& module);
// The offloaded optimizer's slots and step bookkeeping (adam_slots.hpp).
void bind_adam_slots(pybind11::module_& module);
// stowage.offload.parameters' schedule and copies.
void bind_parameters(pybind11::module_& module);

}  // namespace stowage::python
