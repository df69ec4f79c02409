// The offloaded optimizer's state_dict layout, for stowage.offload.Adam (Note [Offloaded
// optimizer state_dict]): describe_parameter names a parameter as state_dicts number it;
// check_adam_state checks a whole saved state_dict, each param group (check_group) and each
// parameter's entry (check_entry), before anything of it is taken; split_device_state gives
// the optimizer that keeps states on the device its part, in its own numbering. The checks raise
// ValueError naming the field and what is wrong with it; Python's repr names the values, so a
// message reads the same whatever wrote the state_dict. Entries are checked with their tensors
// local (FSDP2: this rank's shard, by the `local` the caller gives).
//
// Note [Offloaded optimizer state_dict]
// A parameter's entry is torch's: ``step`` (a float32 scalar tensor), ``exp_avg`` and
// ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad) in the parameter's shape and in the states'
// precision (the parameter's, or fp32 with master_weights). With master_weights a parameter that
// is not fp32 adds its fp32 master weights under ``master``; a checkpoint without them (one
// torch's optimizer wrote) starts the masters from the parameters as they are when it is loaded,
// so load the model's weights first.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "python/bindings/torch/module_parts.hpp"

namespace py = pybind11;

namespace stowage::torch_offload {

namespace {

constexpr std::int64_t kMaxStep = std::int64_t{1} << 53;  // a count a float64 holds exactly

[[noreturn]] void refuse(const std::string& where, const std::string& problem) {
  throw py::value_error(where + ": " + problem);
}

std::string type_name(py::handle value) { return Py_TYPE(value.ptr())->tp_name; }
std::string repr_of(py::handle value) { return py::repr(value).cast<std::string>(); }
std::string quoted(const char* key) { return "'" + std::string(key) + "'"; }

bool whole_count(py::handle value) {
  if (PyLong_Check(value.ptr())) {
    int overflow = 0;
    const long long count = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    return overflow == 0 && count >= 0 && count <= kMaxStep;
  }
  const double count = value.cast<double>();
  return std::isfinite(count) && count >= 0 && count == std::trunc(count) && count <= static_cast<double>(kMaxStep);
}

void check_step(py::object value, const std::string& where) {
  if (THPVariable_Check(value.ptr())) {
    const at::Tensor tensor = THPVariable_Unpack(value.ptr());
    if (tensor.numel() != 1) {
      refuse(where, "'step' has " + std::to_string(tensor.numel()) + " elements; a step count is one number");
    }
    value = value.attr("item")();
  }
  if (PyBool_Check(value.ptr()) || !(PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr()))) {
    refuse(where, "'step' is a " + type_name(value) + "; a step count is a number");
  }
  if (!whole_count(value)) refuse(where, "'step' is " + repr_of(value) + "; a step count is a whole number from 0 to 2**53");
}

void check_moment(const py::dict& entry, const char* key, std::int64_t numel, const std::string& where) {
  const py::object value = entry.attr("get")(key);
  if (!THPVariable_Check(value.ptr())) {
    refuse(where, "no tensor " + quoted(key) + " (got " + type_name(value) + "; is it an Adam state dict?)");
  }
  const at::Tensor tensor = THPVariable_Unpack(value.ptr());
  if (!tensor.is_floating_point() || tensor.is_sparse()) {
    refuse(where, quoted(key) + " is a " + py::str(value.attr("dtype")).cast<std::string>() +
                      " tensor; Adam's states are dense floating point");
  }
  if (tensor.numel() != numel) {
    refuse(where, quoted(key) + " has " + std::to_string(tensor.numel()) + " elements where the parameter has " +
                      std::to_string(numel));
  }
  if (std::string(key) != "exp_avg" && tensor.detach().lt(0).any().item<bool>()) {
    refuse(where, quoted(key) + " holds negative values; a second moment is a mean of squares");
  }
}

void check_entry(const py::object& entry, std::int64_t numel, bool amsgrad, const std::string& where) {
  if (!py::isinstance<py::dict>(entry)) refuse(where, "its state is a " + type_name(entry) + ", not a dict");
  const auto dict = entry.cast<py::dict>();
  check_step(dict.attr("get")("step", 0), where);
  for (const char* key : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
    if (std::string(key) != "max_exp_avg_sq" || amsgrad) check_moment(dict, key, numel, where);
  }
  const py::object master = dict.attr("get")("master");
  if (!master.is_none() && (!THPVariable_Check(master.ptr()) || THPVariable_Unpack(master.ptr()).numel() != numel)) {
    refuse(where, "'master' is not a tensor of the parameter's " + std::to_string(numel) + " elements");
  }
}

// A group's number as float(), or NaN when it is no number.
double number_of(const py::object& value) {
  const bool number = PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr()) || THPVariable_Check(value.ptr());
  return number ? py::float_(value).cast<double>() : std::nan("");
}

void check_group(const py::dict& ours, const py::object& saved, int number, const std::string& where) {
  const std::string group = "param group " + std::to_string(number);
  if (!py::isinstance<py::dict>(saved) || !py::isinstance<py::list>(saved.attr("get")("params"))) {
    refuse(where, group + " is not a dict with a 'params' list");
  }
  const auto dict = saved.cast<py::dict>();
  const std::size_t theirs = py::len(dict["params"]), mine = py::len(ours["params"]);
  if (theirs != mine) {
    refuse(where, group + " has " + std::to_string(theirs) + " parameters where this optimizer's has " +
                      std::to_string(mine));
  }
  for (const char* key : {"lr", "eps", "weight_decay"}) {
    const py::object value = dict.attr("get")(key, ours[key]);
    const double x = number_of(value);
    if (!std::isfinite(x) || x < 0) refuse(where, group + "'s " + key + " is " + repr_of(value) + "; it must be a number >= 0");
  }
  const py::object betas = dict.attr("get")("betas", ours["betas"]);
  bool good = (py::isinstance<py::tuple>(betas) || py::isinstance<py::list>(betas)) && py::len(betas) == 2;
  for (std::size_t i = 0; good && i < 2; ++i) {
    const double beta = py::float_(betas[py::int_(i)]).cast<double>();
    good = beta >= 0 && beta < 1;
  }
  if (!good) refuse(where, group + "'s betas are " + repr_of(betas) + "; two numbers in [0, 1)");
  const py::object amsgrad = dict.attr("get")("amsgrad", ours["amsgrad"]);
  if (py::bool_(amsgrad).cast<bool>() != py::bool_(ours["amsgrad"]).cast<bool>()) {
    const std::string saved_value = repr_of(dict.attr("get")("amsgrad"));
    refuse(where, group + " was saved with amsgrad=" + saved_value + "; make the optimizer with amsgrad=" +
                      saved_value + " to load it");
  }
}

// 'parameter 3 (group 0, shape [64, 24])': its index as state_dicts number it.
std::string describe_parameter(const py::list& param_groups, const py::object& param) {
  const std::string shape = py::str(py::list(param.attr("shape")));
  std::size_t index = 0;
  for (std::size_t number = 0; number < param_groups.size(); ++number) {
    for (const py::handle candidate : param_groups[number]["params"]) {
      if (candidate.is(param)) {
        return "parameter " + std::to_string(index) + " (group " + std::to_string(number) + ", shape " + shape + ")";
      }
      ++index;
    }
  }
  return "a parameter of shape " + shape;
}

// Each parameter's saved entry (None where it has none), after checking the whole state_dict.
py::dict check_state(const py::list& param_groups, const py::object& state_dict, const std::string& owner,
                     const py::function& local) {
  const std::string where = "stowage.offload." + owner + ".load_state_dict";
  if (!py::isinstance<py::dict>(state_dict) || !py::isinstance<py::list>(state_dict.attr("get")("param_groups")) ||
      !py::isinstance<py::dict>(state_dict.attr("get")("state"))) {
    refuse(where, "not an optimizer state_dict (a dict with 'state' and 'param_groups')");
  }
  const auto saved_groups = state_dict["param_groups"].cast<py::list>();
  const auto state = state_dict["state"].cast<py::dict>();
  if (saved_groups.size() != param_groups.size()) {
    refuse(where, "the state_dict has " + std::to_string(saved_groups.size()) + " param groups where this optimizer has " +
                      std::to_string(param_groups.size()) + " (loaded state dict's parameter groups do not match)");
  }
  py::dict by_param;
  for (std::size_t number = 0; number < param_groups.size(); ++number) {
    const auto ours = param_groups[number].cast<py::dict>();
    check_group(ours, saved_groups[number], static_cast<int>(number), where);
    const auto params = ours["params"].cast<py::list>();
    const auto keys = saved_groups[number]["params"].cast<py::list>();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const py::object param = params[i];
      const py::object entry = state.attr("get")(keys[i]);
      if (!py::bool_(entry)) {
        by_param[param] = py::none();
        continue;
      }
      py::object local_entry = entry;
      if (py::isinstance<py::dict>(entry)) {
        py::dict converted;
        for (const auto& [key, value] : entry.cast<py::dict>()) {
          converted[key] = THPVariable_Check(value.ptr()) ? local(value) : py::reinterpret_borrow<py::object>(value);
        }
        local_entry = converted;
      }
      const std::int64_t numel = local(param).cast<at::Tensor>().numel();
      check_entry(local_entry, numel, py::bool_(ours["amsgrad"]), where + ": " + describe_parameter(param_groups, param));
      by_param[param] = entry;
    }
  }
  return by_param;
}

// The state dict of the optimizer that keeps states on the device, in its own numbering, from the
// saved entries of its parameters (hyper-parameters as it has them now).
py::dict split_state(const py::list& inner_groups, const py::dict& by_param) {
  py::dict state;
  py::list groups;
  std::size_t index = 0;
  for (const py::handle group_handle : inner_groups) {
    const py::dict group = py::reinterpret_borrow<py::dict>(group_handle);
    py::list ids;
    for (const py::handle param : group["params"]) {
      const py::object saved = by_param.attr("get")(param);
      if (py::bool_(saved)) {
        py::dict entry;
        for (const auto& [key, value] : saved.cast<py::dict>()) {
          if (py::str(key).cast<std::string>() != "master") entry[key] = value;
        }
        state[py::int_(index)] = entry;
      }
      ids.append(index++);
    }
    py::dict copy;
    for (const auto& [key, value] : group) {
      if (py::str(key).cast<std::string>() != "params") copy[key] = value;
    }
    copy["params"] = ids;
    groups.append(copy);
  }
  py::dict out;
  out["state"] = state;
  out["param_groups"] = groups;
  return out;
}

}  // namespace

}  // namespace stowage::torch_offload

namespace stowage::python {

void bind_adam_state_check(py::module_& module) {
  module.def("describe_parameter", &torch_offload::describe_parameter, py::arg("param_groups"), py::arg("param"),
             "'parameter 3 (group 0, shape [64, 24])': a parameter as state_dicts number it");
  module.def("check_adam_state", &torch_offload::check_state, py::arg("param_groups"), py::arg("state_dict"),
             py::arg("owner"), py::arg("local"),
             "Checks a whole saved Adam state_dict against these param groups before anything is taken from it; "
             "returns each parameter's saved entry (None where it has none). Raises ValueError naming the "
             "parameter and the field");
  module.def("split_device_state", &torch_offload::split_state, py::arg("param_groups"), py::arg("by_param"),
             "The state dict of the optimizer keeping states on the device, in its numbering, from the saved "
             "entries of its parameters");
}

}  // namespace stowage::python
