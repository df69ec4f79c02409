// PythonObjects reading back what a reading made: the walk, the format checks, traces as columns.
#include "python/bindings/python_objects.hpp"

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

void PythonObjects::children(Handle container, std::vector<Handle>& out) {
  PyObject* value = object(container);
  if (PyDict_Check(value)) {
    Py_ssize_t position = 0;
    PyObject* key = nullptr;
    PyObject* item = nullptr;
    while (PyDict_Next(value, &position, &key, &item) != 0) out.push_back(key);
    position = 0;
    while (PyDict_Next(value, &position, &key, &item) != 0) out.push_back(item);
  } else if (PyList_Check(value)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); ++i) out.push_back(PyList_GET_ITEM(value, i));
  } else if (PyTuple_Check(value)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); ++i) out.push_back(PyTuple_GET_ITEM(value, i));
  }
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
