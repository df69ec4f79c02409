// stowage._core's planner part: the lifetime trace, the cost model, simulating a plan and solving
// for one under a budget (planner/). Decisions cross as their names ("keep", "offload",
// "recompute"); a simulation as a dict.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "allocator/base/errors.hpp"
#include "planner/exhaustive_solver.hpp"
#include "planner/greedy_solver.hpp"
#include "planner/simulator.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;

namespace stowage::python {
namespace {

using planner::Decision;

Decision decision_named(const std::string& name) {
  for (const Decision d : {Decision::kKeep, Decision::kOffload, Decision::kRecompute}) {
    if (planner::decision_name(d) == name) return d;
  }
  STOWAGE_CHECK(false, "a decision is keep, offload or recompute, not '", name, "'");
  return Decision::kKeep;
}

py::dict simulation_dict(const planner::Simulation& s) {
  py::dict out;
  out["peak_bytes"] = s.peak_bytes;
  out["peak_op"] = s.peak_op;
  out["step_ms"] = s.step_ms;
  out["recompute_ms"] = s.recompute_ms;
  out["stall_ms"] = s.stall_ms;
  out["bytes_at_op"] = s.bytes_at_op;
  return out;
}

py::tuple solution_tuple(const planner::Solution& solution) {
  std::vector<std::string> names;
  names.reserve(solution.plan.size());
  for (const Decision d : solution.plan) names.emplace_back(planner::decision_name(d));
  return py::make_tuple(names, simulation_dict(solution.simulation), solution.fits);
}

void bind_values(py::module_& module) {
  py::enum_<planner::Phase>(module, "TracePhase")
      .value("forward", planner::Phase::kForward)
      .value("backward", planner::Phase::kBackward)
      .value("optimizer", planner::Phase::kOptimizer);
  py::class_<planner::TraceOp>(module, "TraceOp")
      .def(py::init<>())
      .def_readwrite("name", &planner::TraceOp::name)
      .def_readwrite("module", &planner::TraceOp::module)
      .def_readwrite("phase", &planner::TraceOp::phase)
      .def_readwrite("duration_ms", &planner::TraceOp::duration_ms)
      .def_readwrite("other_bytes", &planner::TraceOp::other_bytes);
  py::class_<planner::SavedTensor>(module, "SavedTensor")
      .def(py::init<>())
      .def_readwrite("module", &planner::SavedTensor::module)
      .def_readwrite("bytes", &planner::SavedTensor::bytes)
      .def_readwrite("created", &planner::SavedTensor::created)
      .def_readwrite("last_forward_use", &planner::SavedTensor::last_forward_use)
      .def_readwrite("first_backward_use", &planner::SavedTensor::first_backward_use)
      .def_readwrite("last_backward_use", &planner::SavedTensor::last_backward_use)
      .def_readwrite("recompute_ms", &planner::SavedTensor::recompute_ms)
      .def_readwrite("recomputable", &planner::SavedTensor::recomputable)
      .def_readwrite("offloadable", &planner::SavedTensor::offloadable)
      .def_readwrite("recompute_inputs", &planner::SavedTensor::recompute_inputs)
      .def_readwrite("region", &planner::SavedTensor::region);
  py::class_<planner::LifetimeTrace>(module, "LifetimeTrace")
      .def(py::init<>())
      .def_readwrite("ops", &planner::LifetimeTrace::ops)
      .def_readwrite("tensors", &planner::LifetimeTrace::tensors)
      .def("validate", &planner::LifetimeTrace::validate)
      .def("compute_ms", &planner::LifetimeTrace::compute_ms);
  py::class_<planner::CostModel>(module, "CostModel")
      .def(py::init<double, double, std::size_t>(), py::arg("to_host_bytes_per_ms"),
           py::arg("to_device_bytes_per_ms"), py::arg("prefetch_pages") = 2)
      .def_readwrite("to_host_bytes_per_ms", &planner::CostModel::to_host_bytes_per_ms)
      .def_readwrite("to_device_bytes_per_ms", &planner::CostModel::to_device_bytes_per_ms)
      .def_readwrite("prefetch_pages", &planner::CostModel::prefetch_pages);
}

}  // namespace

void bind_planner(py::module_& module) {
  bind_values(module);
  module.def(
      "plan_simulate",
      [](const planner::LifetimeTrace& trace, const planner::CostModel& cost, const std::vector<std::string>& names,
         std::optional<std::uint64_t> ceiling) {
        planner::Plan plan;
        plan.reserve(names.size());
        for (const auto& name : names) plan.push_back(decision_named(name));
        planner::Simulator simulator(trace, cost, ceiling.value_or(planner::Simulator::kNoCeiling));
        return simulation_dict(simulator.simulate(plan));
      },
      py::arg("trace"), py::arg("cost"), py::arg("decisions"), py::arg("ceiling") = py::none(),
      "The peak device memory and step time of a plan (one decision name per saved tensor), run "
      "under an allocated ceiling of `ceiling` bytes when given.");
  module.def(
      "plan_solve",
      [](const planner::LifetimeTrace& trace, const planner::CostModel& cost, std::uint64_t budget, bool exact) {
        planner::Simulator simulator(trace, cost, budget);  // a plan's step runs with its ceiling at its budget
        planner::Solution solution;
        {
          const py::gil_scoped_release release;
          solution = exact ? planner::solve_exhaustive(simulator, budget) : planner::solve_greedy(simulator, budget);
        }
        return solution_tuple(solution);
      },
      py::arg("trace"), py::arg("cost"), py::arg("budget"), py::arg("exact") = false,
      "(decisions, simulation, fits): the fastest plan found whose peak fits the budget (greedy, or "
      "exhaustive for up to 16 saved tensors); the lowest peak found when none fits.");
}

}  // namespace stowage::python
