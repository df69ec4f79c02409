#include "python/bindings/python_objects.hpp"

#include <pybind11/pybind11.h>

#include "snapshot/refusal.hpp"

namespace py = pybind11;

namespace stowage::python {

using snapshot::BadPickle;
using snapshot::Handle;
using snapshot::Kind;
using snapshot::Name;

namespace {

// Python's errors that a pickle's bytes can cause, as the old reader counted them.
bool caused_by_the_pickle(PyObject* type) {
  PyObject* const kinds[] = {PyExc_ValueError,  PyExc_TypeError,    PyExc_OverflowError,
                             PyExc_MemoryError, PyExc_RecursionError, PyExc_KeyError,
                             PyExc_IndexError,  PyExc_AttributeError, PyExc_EOFError};
  for (PyObject* kind : kinds) {
    if (PyErr_GivenExceptionMatches(type, kind) != 0) return true;
  }
  return false;
}

std::string text_of(PyObject* str) {
  PyObject* encoded = PyUnicode_AsEncodedString(str, "utf-8", "surrogatepass");
  if (encoded == nullptr) {
    PyErr_Clear();
    return "?";
  }
  std::string out(PyBytes_AS_STRING(encoded), static_cast<std::size_t>(PyBytes_GET_SIZE(encoded)));
  Py_DECREF(encoded);
  return out;
}

PyObject* bytes_of(std::string_view text) {
  return PyBytes_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
}

}  // namespace

PythonObjects::PythonObjects() {
  name_ids_ = PyDict_New();
  if (name_ids_ == nullptr) throw py::error_already_set();
  for (int i = 1; i < snapshot::kNameCount; ++i) {
    const std::string_view text = snapshot::text_of(static_cast<Name>(i));
    PyObject* name = PyUnicode_InternFromString(std::string(text).c_str());
    PyObject* id = PyLong_FromLong(i);
    if (name == nullptr || id == nullptr || PyDict_SetItem(name_ids_, name, id) != 0) {
      Py_XDECREF(id);
      throw py::error_already_set();
    }
    Py_DECREF(id);
    names_[static_cast<std::size_t>(i)] = name;
  }
}

PythonObjects::~PythonObjects() {
  for (PyObject* name : names_) Py_XDECREF(name);
  Py_XDECREF(name_ids_);
}

void PythonObjects::fail() {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  if (type == nullptr || !caused_by_the_pickle(type)) {
    PyErr_Restore(type, value, traceback);
    throw py::error_already_set();
  }
  PyErr_NormalizeException(&type, &value, &traceback);
  std::string message;
  if (PyObject* text = value != nullptr ? PyObject_Str(value) : nullptr) {
    message = text_of(text);
    Py_DECREF(text);
  }
  PyErr_Clear();
  if (message.empty()) message = reinterpret_cast<PyTypeObject*>(type)->tp_name;
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  throw BadPickle(message);
}

PyObject* PythonObjects::made(PyObject* made_object) {
  if (made_object == nullptr) fail();
  return made_object;
}

Handle PythonObjects::make_none() { return Py_NewRef(Py_None); }
Handle PythonObjects::make_bool(bool value) { return Py_NewRef(value ? Py_True : Py_False); }
Handle PythonObjects::make_int(std::int64_t value) { return made(PyLong_FromLongLong(value)); }
Handle PythonObjects::make_float(double value) { return made(PyFloat_FromDouble(value)); }

Handle PythonObjects::make_str(std::string_view utf8) {
  return made(PyUnicode_DecodeUTF8(utf8.data(), static_cast<Py_ssize_t>(utf8.size()), "surrogatepass"));
}

Handle PythonObjects::make_ascii(std::string_view ascii) {
  return made(PyUnicode_DecodeASCII(ascii.data(), static_cast<Py_ssize_t>(ascii.size()), "strict"));
}

Handle PythonObjects::make_bytes(std::string_view bytes) { return made(bytes_of(bytes)); }

Handle PythonObjects::make_list(std::span<const Handle> items) {
  PyObject* list = made(PyList_New(static_cast<Py_ssize_t>(items.size())));
  for (std::size_t i = 0; i < items.size(); ++i) {
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), Py_NewRef(object(items[i])));
  }
  return list;
}

Handle PythonObjects::make_dict() { return made(PyDict_New()); }

Handle PythonObjects::make_tuple(std::span<const Handle> items) {
  PyObject* tuple = made(PyTuple_New(static_cast<Py_ssize_t>(items.size())));
  for (std::size_t i = 0; i < items.size(); ++i) {
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), Py_NewRef(object(items[i])));
  }
  return tuple;
}

void PythonObjects::extend(Handle list, std::span<const Handle> items) {
  for (const Handle item : items) {
    if (PyList_Append(object(list), object(item)) != 0) fail();
  }
}

void PythonObjects::set_item(Handle dict, Handle key, Handle value) {
  if (PyDict_SetItem(object(dict), object(key), object(value)) != 0) fail();
}

void PythonObjects::retain(Handle handle) { Py_INCREF(object(handle)); }
void PythonObjects::release(Handle handle) { Py_DECREF(object(handle)); }

std::string PythonObjects::number_shown(PyObject* integer) {
  PyObject* bits = PyObject_CallMethod(integer, "bit_length", nullptr);
  const long long count = bits != nullptr ? PyLong_AsLongLong(bits) : -1;
  Py_XDECREF(bits);
  PyErr_Clear();
  if (count >= 4000) return "of " + with_commas(static_cast<std::uint64_t>(count)) + " bits";
  return repr(integer);
}

snapshot::TextNumber PythonObjects::parse_int(std::string_view line) {
  PyObject* text = made(bytes_of(line));
  PyObject* number = PyNumber_Long(text);  // int(line), as the old reader read it
  Py_DECREF(text);
  if (number == nullptr) fail();
  snapshot::TextNumber out;
  int overflow = 0;
  out.integer = PyLong_AsLongLongAndOverflow(number, &overflow);
  out.fits = overflow == 0;
  if (!out.fits) out.shown = number_shown(number);
  Py_DECREF(number);
  return out;
}

snapshot::TextNumber PythonObjects::parse_float(std::string_view line) {
  PyObject* text = made(bytes_of(line));
  PyObject* number = PyFloat_FromString(text);  // float(line)
  Py_DECREF(text);
  if (number == nullptr) fail();
  snapshot::TextNumber out;
  out.real = PyFloat_AS_DOUBLE(number);
  Py_DECREF(number);
  return out;
}

Handle PythonObjects::make_escaped_ascii(std::string_view quoted_body) {
  PyObject* codecs = made(PyImport_ImportModule("codecs"));
  PyObject* raw = bytes_of(quoted_body);
  PyObject* decoded = raw != nullptr ? PyObject_CallMethod(codecs, "escape_decode", "O", raw) : nullptr;
  Py_DECREF(codecs);
  Py_XDECREF(raw);
  if (decoded == nullptr) fail();
  PyObject* bytes = PyTuple_GetItem(decoded, 0);
  PyObject* text = bytes != nullptr && PyBytes_Check(bytes)
                       ? PyUnicode_DecodeASCII(PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes), "strict")
                       : nullptr;
  Py_DECREF(decoded);
  return made(text);
}

Handle PythonObjects::make_raw_unicode_escape(std::string_view line) {
  return made(PyUnicode_DecodeRawUnicodeEscape(line.data(), static_cast<Py_ssize_t>(line.size()), "strict"));
}

std::string PythonObjects::utf8_of(Handle str) { return text_of(object(str)); }

std::string PythonObjects::repr(Handle handle) {
  PyObject* text = PyObject_Repr(object(handle));
  if (text == nullptr) {
    PyErr_Clear();
    return "?";
  }
  std::string out = text_of(text);
  Py_DECREF(text);
  return out;
}

std::string PythonObjects::float_repr(double value) {
  char* text = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);
  if (text == nullptr) {
    PyErr_Clear();
    return "?";
  }
  std::string out(text);
  PyMem_Free(text);
  return out;
}

std::string PythonObjects::long_repr(std::span<const std::uint8_t> little_endian) {
  // int.from_bytes(raw, "little", signed=True): two's complement, as LONG1 and LONG4 write it.
  PyObject* raw = bytes_of({reinterpret_cast<const char*>(little_endian.data()), little_endian.size()});
  PyObject* method = PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyLong_Type), "from_bytes");
  PyObject* args = raw != nullptr ? Py_BuildValue("(Os)", raw, "little") : nullptr;
  PyObject* keywords = Py_BuildValue("{s:O}", "signed", Py_True);
  PyObject* number = method != nullptr && args != nullptr && keywords != nullptr
                         ? PyObject_Call(method, args, keywords)
                         : nullptr;
  Py_XDECREF(raw);
  Py_XDECREF(method);
  Py_XDECREF(args);
  Py_XDECREF(keywords);
  if (number == nullptr) {
    PyErr_Clear();
    return "?";
  }
  std::string shown = number_shown(number);
  Py_DECREF(number);
  return shown;
}

}  // namespace stowage::python
