#include "python/bindings/python_values.hpp"

#include <cstdint>
#include <limits>

#include "allocator/base/errors.hpp"

namespace py = pybind11;

namespace stowage::python {

using snapshot::Wide;

Wide wide_of(const py::handle& value) {
  int overflow = 0;
  const long long narrow = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (narrow == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (overflow == 0) return Wide{narrow};
  const py::int_ whole = py::reinterpret_borrow<py::int_>(value);
  const py::object high = whole.attr("__rshift__")(64);
  const long long high_part = PyLong_AsLongLongAndOverflow(high.ptr(), &overflow);
  STOWAGE_CHECK(overflow == 0 && high_part >= -(1LL << 62) && high_part < (1LL << 62),
                "a live-bytes value past 2**126 cannot be a trace's");
  const auto low = whole.attr("__and__")(py::int_(std::numeric_limits<std::uint64_t>::max())).cast<std::uint64_t>();
  return Wide{high_part} * (Wide{1} << 64) + Wide{low};
}

py::int_ int_of(Wide value) {
  if (value >= std::numeric_limits<std::int64_t>::min() && value <= std::numeric_limits<std::int64_t>::max()) {
    return py::int_(static_cast<std::int64_t>(value));
  }
  const auto high = static_cast<std::int64_t>(value >> 64);  // (arithmetic shift: floor)
  const auto low = static_cast<std::uint64_t>(value - (Wide{high} << 64));
  return py::reinterpret_steal<py::int_>(
      (py::int_(high).attr("__lshift__")(64).attr("__or__")(py::int_(low))).release());
}

std::string utf8_of(const py::handle& value) {
  const py::str text(value);
  const py::object utf8 = py::reinterpret_steal<py::object>(
      PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogatepass"));
  if (!utf8) throw py::error_already_set();
  return utf8.cast<std::string>();
}

py::str utf8_str(const std::string& utf8) {
  PyObject* made = PyUnicode_DecodeUTF8(utf8.data(), static_cast<Py_ssize_t>(utf8.size()), "surrogatepass");
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(made);
}

}  // namespace stowage::python
