// PythonObjects reading back what a reading made: the walk, the format checks, traces as columns.
#include "python/bindings/python_objects.hpp"

#include <algorithm>

namespace stowage::python {

using snapshot::Handle;
using snapshot::Kind;
using snapshot::Name;

Kind PythonObjects::kind_of(Handle handle) {
  PyObject* value = object(handle);
  if (PyUnicode_CheckExact(value)) return Kind::kStr;
  if (PyLong_CheckExact(value)) return Kind::kInt;
  if (PyDict_CheckExact(value)) return Kind::kDict;
  if (PyList_CheckExact(value)) return Kind::kList;
  if (value == Py_None) return Kind::kNone;
  if (PyBool_Check(value)) return Kind::kBool;
  if (PyFloat_Check(value)) return Kind::kFloat;
  if (PyLong_Check(value)) return Kind::kInt;
  if (PyTuple_Check(value)) return Kind::kTuple;
  if (PyUnicode_Check(value)) return Kind::kStr;
  if (PyBytes_Check(value)) return Kind::kBytes;
  if (PyList_Check(value)) return Kind::kList;
  if (PyDict_Check(value)) return Kind::kDict;
  return Kind::kOther;
}

bool PythonObjects::shared(Handle handle) { return Py_REFCNT(object(handle)) > 1; }

// A list's or tuple's cursor is the index of its next item; a dict's is PyDict_Next's position,
// doubled, plus 1 once its keys are given and its values are being.
bool PythonObjects::children(Handle container, std::size_t& cursor, std::size_t most, std::vector<Handle>& out) {
  PyObject* value = object(container);
  if (PyDict_Check(value)) {
    bool values = (cursor & 1) != 0;
    auto position = static_cast<Py_ssize_t>(cursor >> 1);
    PyObject* key = nullptr;
    PyObject* item = nullptr;
    for (std::size_t given = 0; given < most;) {
      if (PyDict_Next(value, &position, &key, &item) == 0) {
        if (values) return false;
        values = true;
        position = 0;
        continue;
      }
      out.push_back(values ? item : key);
      ++given;
    }
    cursor = (static_cast<std::size_t>(position) << 1) | (values ? 1 : 0);
    return true;
  }
  const std::size_t count = length(container);  // a list's or tuple's items
  const std::size_t end = std::min(count, cursor + most);
  for (std::size_t i = cursor; i < end; ++i) out.push_back(item(container, i));
  cursor = end;
  return end < count;
}

std::size_t PythonObjects::length(Handle container) {
  PyObject* value = object(container);
  if (PyList_Check(value)) return static_cast<std::size_t>(PyList_GET_SIZE(value));
  if (PyTuple_Check(value)) return static_cast<std::size_t>(PyTuple_GET_SIZE(value));
  if (PyDict_Check(value)) return static_cast<std::size_t>(PyDict_Size(value));
  return 0;
}

Handle PythonObjects::item(Handle container, std::size_t index) {
  PyObject* value = object(container);
  const auto at = static_cast<Py_ssize_t>(index);
  return PyList_Check(value) ? PyList_GET_ITEM(value, at) : PyTuple_GET_ITEM(value, at);
}

Handle PythonObjects::find(Handle dict, Name key) {
  PyObject* found = PyDict_GetItemWithError(object(dict), names_[static_cast<std::size_t>(key)]);
  if (found == nullptr && PyErr_Occurred() != nullptr) fail();
  return found;
}

Name PythonObjects::name_of(Handle str) {
  PyObject* id = PyDict_GetItemWithError(name_ids_, object(str));
  if (id == nullptr) {
    PyErr_Clear();
    return Name::kOther;
  }
  return static_cast<Name>(PyLong_AsLong(id));
}

bool PythonObjects::same_str(Handle a, Handle b) {
  if (a == b) return true;
  const int compared = PyUnicode_Compare(object(a), object(b));
  if (compared == -1 && PyErr_Occurred() != nullptr) PyErr_Clear();
  return compared == 0;
}

std::int64_t PythonObjects::int_of(Handle integer, bool& fits) {
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(object(integer), &overflow);
  if (value == -1 && PyErr_Occurred() != nullptr) PyErr_Clear();
  fits = overflow == 0;
  return value;
}

bool PythonObjects::uint_of(Handle integer, std::uint64_t& value) {
  const unsigned long long read = PyLong_AsUnsignedLongLong(object(integer));
  if (PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    return false;
  }
  value = read;
  return true;
}

double PythonObjects::float_of(Handle real) { return PyFloat_AsDouble(object(real)); }

std::string PythonObjects::other_type_name(Handle handle) {
  PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(object(handle))), "__name__");
  if (name == nullptr || !PyUnicode_Check(name)) {
    Py_XDECREF(name);
    PyErr_Clear();
    return "object";
  }
  const char* text = PyUnicode_AsUTF8(name);
  std::string out = text != nullptr ? text : "object";
  Py_DECREF(name);
  PyErr_Clear();
  return out;
}

}  // namespace stowage::python
