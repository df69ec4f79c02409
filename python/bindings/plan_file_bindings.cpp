// stowage._core's planner files: a lifetime trace, a sized one and a plan, as json.loads gave
// them, checked against their schemas and bounds and read into the planner's traces
// (planner/file_formats.hpp), walked as Python objects without copying them. A refusal is raised
// as stowage.validation's InputError naming the file and the field.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "planner/file_formats.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;

namespace stowage::python {
namespace {

using planner::DocKind;
using planner::DocNode;

PyObject* object_of(DocNode node) { return const_cast<PyObject*>(static_cast<const PyObject*>(node)); }

// A document json.loads made (or a caller built), read in place. The caller holds the GIL and
// the document throughout; values of other types than JSON's are kOther, named by
// stowage.validation's shown and kind_of, as the refusals always named them.
class PythonDocument final : public planner::DocumentView {
 public:
  PythonDocument() : errors_(py::module_::import("stowage.validation")) {}

  DocKind kind(DocNode node) override {
    PyObject* value = object_of(node);
    if (PyUnicode_CheckExact(value)) return DocKind::kStr;
    if (PyLong_CheckExact(value)) return DocKind::kInt;
    if (PyDict_CheckExact(value)) return DocKind::kDict;
    if (PyList_CheckExact(value)) return DocKind::kList;
    if (PyFloat_CheckExact(value)) return DocKind::kFloat;
    if (value == Py_None) return DocKind::kNull;
    if (PyBool_Check(value)) return DocKind::kBool;
    return DocKind::kOther;
  }

  bool as_bool(DocNode node) override { return object_of(node) == Py_True; }

  bool as_int(DocNode node, std::int64_t& value, bool& negative) override {
    int overflow = 0;
    value = PyLong_AsLongLongAndOverflow(object_of(node), &overflow);
    if (value == -1 && PyErr_Occurred() != nullptr) PyErr_Clear();
    negative = overflow < 0;
    return overflow == 0;
  }

  double as_float(DocNode node) override { return PyFloat_AS_DOUBLE(object_of(node)); }

  std::string_view as_str(DocNode node, std::size_t& characters) override {
    PyObject* value = object_of(node);
    characters = static_cast<std::size_t>(PyUnicode_GET_LENGTH(value));
    Py_ssize_t size = 0;
    if (const char* utf8 = PyUnicode_AsUTF8AndSize(value, &size); utf8 != nullptr) {
      return {utf8, static_cast<std::size_t>(size)};
    }
    PyErr_Clear();  // a lone surrogate (json.loads makes one of "\ud800"): kept as written
    const py::object bytes =
        py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(value, "utf-8", "surrogatepass"));
    if (!bytes) throw py::error_already_set();
    scratch_.assign(PyBytes_AS_STRING(bytes.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(bytes.ptr())));
    return scratch_;
  }

  std::size_t length(DocNode node) override {
    PyObject* value = object_of(node);
    return static_cast<std::size_t>(PyList_Check(value) ? PyList_GET_SIZE(value) : PyDict_Size(value));
  }

  DocNode item(DocNode list, std::size_t index) override {
    return PyList_GET_ITEM(object_of(list), static_cast<Py_ssize_t>(index));
  }

  bool next_field(DocNode dict, std::size_t& cursor, DocNode& key, DocNode& value) override {
    auto position = static_cast<Py_ssize_t>(cursor);
    PyObject* found_key = nullptr;
    PyObject* found_value = nullptr;
    if (PyDict_Next(object_of(dict), &position, &found_key, &found_value) == 0) return false;
    cursor = static_cast<std::size_t>(position);
    key = found_key;
    value = found_value;
    return true;
  }

  DocNode field(DocNode dict, std::string_view key) override {
    auto name = names_.find(key);
    if (name == names_.end()) {
      name = names_.emplace(std::string(key), py::str(key.data(), key.size())).first;
    }
    PyObject* found = PyDict_GetItemWithError(object_of(dict), name->second.ptr());
    if (found == nullptr && PyErr_Occurred() != nullptr) throw py::error_already_set();
    return found;
  }

  bool equals(DocNode node, std::string_view text) override { return compare(node, py::str(text.data(), text.size())); }
  bool equals(DocNode node, std::int64_t integer) override { return compare(node, py::int_(integer)); }

  // As f"[{key}]" or f".{key}" writes it (isinstance(key, int): an index).
  std::string path_text(DocNode key, bool& index) override {
    index = PyLong_Check(object_of(key));
    const py::object text = py::reinterpret_steal<py::object>(PyObject_Format(object_of(key), nullptr));
    if (!text) throw py::error_already_set();
    return text.cast<std::string>();
  }

  std::string shown(DocNode node) override {
    return errors_.attr("shown")(py::handle(object_of(node))).cast<std::string>();
  }

  std::string described(DocNode node) override {
    const py::handle value(object_of(node));
    std::string text = errors_.attr("kind_of")(value).cast<std::string>();
    if (!PyList_Check(value.ptr()) && !PyDict_Check(value.ptr()) && !value.is_none()) {
      text.append(" (").append(shown(node)).append(")");
    }
    return text;
  }

 private:
  bool compare(DocNode node, const py::object& other) {
    const int equal = PyObject_RichCompareBool(object_of(node), other.ptr(), Py_EQ);
    if (equal < 0) throw py::error_already_set();
    return equal == 1;
  }

  py::module_ errors_;
  std::map<std::string, py::str, std::less<>> names_;  // the field names asked for, as Python strs
  std::string scratch_;
};

// Raises a refusal as stowage.validation's InputError: the file (`where`), the field, the problem.
void raise_refusal(const std::optional<planner::Refusal>& refused, const std::string& where) {
  if (!refused) return;
  const py::object error =
      py::module_::import("stowage.validation").attr("InputError")(where, refused->field, refused->problem);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

// The traces read (the first alone where `one`), or the refusal raised.
py::object result(planner::ReadDocument read, const std::string& where, bool one) {
  raise_refusal(read.refusal, where);
  if (one) return py::cast(std::move(read.traces.front()));
  return py::cast(std::move(read.traces));
}

}  // namespace

void bind_plan_files(py::module_& module) {
  module.def(
      "read_plan_file",
      [](const py::object& document, const std::string& where, const std::string& format) {
        PythonDocument view;
        if (format == planner::kSizedFormat) return result(planner::read_sized(view, document.ptr()), where, false);
        if (format == planner::kPlanFormat) {
          planner::ReadDocument read = planner::read_plan(view, document.ptr());
          raise_refusal(read.refusal, where);
          return py::object(py::make_tuple(std::move(read.traces.front()), std::move(read.decisions)));
        }
        return result(planner::read_lifetimes(view, document.ptr()), where, true);
      },
      py::arg("document"), py::arg("where"), py::arg("format"),
      "A planner file's document (a lifetime trace, a sized one, a plan: by `format`) checked and read: its "
      "LifetimeTrace (a sized trace's, one per grid point; a plan's with its decisions); InputError naming "
      "`where` and the field.");
  module.def(
      "check_plan_cost",
      [](const py::object& cost, const std::string& where, std::size_t tensors) {
        PythonDocument view;
        raise_refusal(planner::check_cost(view, cost.ptr(), tensors), where);
      },
      py::arg("cost"), py::arg("where"), py::arg("tensors"), "InputError for a cost model outside its bounds.");
  module.def(
      "plan_problem",
      [](const planner::LifetimeTrace& trace, const py::sequence& decisions) -> std::optional<std::string> {
        planner::Plan plan;
        plan.reserve(decisions.size());
        for (const py::handle item : decisions) {
          if (!py::isinstance<planner::Decision>(item)) {
            std::string shown = py::repr(item).cast<std::string>();
            if (shown.size() > 60) shown.resize(60);
            return "stowage.plan: decision " + std::to_string(plan.size()) + " is " + shown +
                   ", not a stowage.plan.Decision (Decision.keep, Decision.offload or Decision.recompute)";
          }
          plan.push_back(item.cast<planner::Decision>());
        }
        return planner::plan_problem(trace, plan);
      },
      py::arg("trace"), py::arg("decisions"),
      "Why the runtime cannot apply these decisions (a sequence of Decision) to the trace's tensors (the "
      "first), or None.");

  py::module_ limits =
      module.def_submodule("plan_file_limits", "The planner files' formats and the bounds Python checks before reading (planner/file_formats.hpp).");
  limits.attr("LIFETIMES") = std::string(planner::kLifetimesFormat);
  limits.attr("SIZED") = std::string(planner::kSizedFormat);
  limits.attr("PLAN") = std::string(planner::kPlanFormat);
  for (const auto& [name, value] : {std::pair{"VERSION", planner::kFormatVersion}, {"MAX_SIZES", planner::kMaxSizes},
                                    {"MAX_POINTS", planner::kMaxPoints}, {"MAX_GRID_POINTS", planner::kMaxGridPoints},
                                    {"MAX_SIZE_VALUE", planner::kMaxSizeValue}}) {
    limits.attr(name) = value;
  }
  limits.attr("MAX_TOTAL_BYTES") = planner::kMaxTotalBytes;
}

}  // namespace stowage::python
