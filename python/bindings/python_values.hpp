// Values crossing into and out of the trace analyses' bindings: 128-bit byte counts (Note [Live
// bytes in 128 bits]) as Python's integers, and strings as UTF-8 with lone surrogates (which a
// snapshot's strings may hold) written as Python's surrogatepass writes them.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "snapshot/live_series.hpp"

namespace stowage::python {

snapshot::Wide wide_of(const pybind11::handle& value);
pybind11::int_ int_of(snapshot::Wide value);
std::string utf8_of(const pybind11::handle& value);  // str(value)
pybind11::str utf8_str(const std::string& utf8);

}  // namespace stowage::python
