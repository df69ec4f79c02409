// stowage._core's planner part: the lifetime trace, the cost model, what follows from a trace's
// measured figures, a step recorded at a grid of sizes, simulating a plan, and one call from a
// budget to a plan, and what applying and printing a plan reads off its trace (planner/).
// Decisions cross as the Decision enum; results as typed, read-only objects.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/errors.hpp"
#include "planner/prefetch_search.hpp"
#include "planner/file_formats.hpp"
#include "planner/fit_weighing.hpp"
#include "planner/parameter_prefetch.hpp"
#include "planner/plan_lookup.hpp"
#include "planner/plan_report.hpp"
#include "planner/region_policy.hpp"
#include "planner/share_search.hpp"
#include "planner/simulator.hpp"
#include "planner/sized_trace.hpp"
#include "planner/step_departures.hpp"
#include "planner/step_difference.hpp"
#include "planner/step_ledger.hpp"
#include "planner/trace_builder.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace stowage::python {
namespace {

// Binds (name, member) pairs as read-only attributes: a struct's fields, written once.
template <typename Class>
void readonly(Class& /*bound*/) {}
template <typename Class, typename Member, typename... Rest>
void readonly(Class& bound, const char* name, Member member, Rest... rest) {
  bound.def_readonly(name, member);
  readonly(bound, rest...);
}

// A plan solved under a budget: its decisions, their simulation, whether it fits, and the
// prefetch depth it was solved at (Note [Prefetch depth]), with the trace under that depth (the
// plan carries its depth to the offloader).
struct BudgetPlan {
  planner::LifetimeTrace trace;
  planner::Plan decisions;
  planner::Simulation simulation;
  bool fits = false;
  std::size_t prefetch_depth = 0;
};

void bind_recording(py::module_& module) {
  py::class_<planner::RecordedRegion>(module, "RecordedRegion")
      .def(py::init([](std::string path, std::int64_t call) {
             return planner::RecordedRegion{std::move(path), true, {}, call};
           }),
           py::arg("module"), py::arg("call"))
      .def_readwrite("checkpointable", &planner::RecordedRegion::checkpointable);
  py::class_<planner::StepLedger>(module, "StepLedger",
                                  "The storages of a step as it is recorded (Note [Keeping the ledger]).")
      .def(py::init<>())
      .def("add_fixed", &planner::StepLedger::add_fixed, py::arg("key"))
      .def("op_ran", &planner::StepLedger::op_ran, py::arg("phase"), py::arg("used"), py::arg("made"))
      .def("made_outside_ops", &planner::StepLedger::made_outside_ops, py::arg("phase"), py::arg("made"))
      .def("enter_region", &planner::StepLedger::enter_region, py::arg("inputs"))
      .def("writes_input", &planner::StepLedger::writes_input, py::arg("region"), py::arg("written"))
      .def("save", &planner::StepLedger::save, py::arg("key"), py::arg("bytes"), py::arg("region"), py::arg("site"))
      .def("taken_back", &planner::StepLedger::taken_back, py::arg("storage"))
      .def(
          "trace",
          [](const planner::StepLedger& ledger, std::vector<planner::TraceOp> ops,
             std::vector<planner::RecordedRegion> regions) {
            return planner::build_trace(ledger.recording(std::move(ops), std::move(regions))).trace;
          },
          py::arg("ops"), py::arg("regions"), "The recorded step's lifetime trace (Note [Building a trace]).");
}

void bind_results(py::module_& module) {
  module.def("step_difference", &planner::step_difference, py::arg("first"), py::arg("other"), py::arg("at_first"),
             py::arg("at_other"), "How two recordings of a step at other sizes differ, or None (one step).");
  using planner::Simulation;
  py::class_<Simulation> simulation(module, "Simulation");
  readonly(simulation, "peak_bytes", &Simulation::peak_bytes, "peak_op", &Simulation::peak_op, "step_ms",
           &Simulation::step_ms, "recompute_ms", &Simulation::recompute_ms, "stall_ms", &Simulation::stall_ms,
           "bytes_at_op", &Simulation::bytes_at_op);
  py::class_<BudgetPlan> budget_plan(module, "BudgetPlan");
  readonly(budget_plan, "decisions", &BudgetPlan::decisions, "simulation", &BudgetPlan::simulation, "fits",
           &BudgetPlan::fits, "prefetch_depth", &BudgetPlan::prefetch_depth, "trace", &BudgetPlan::trace);
  py::class_<planner::SizedTrace>(module, "SizedTrace")
      .def(py::init([](const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& sizes,
                       std::vector<planner::LifetimeTrace> traces) {
             std::vector<planner::GridSize> grid;
             for (const auto& [name, points] : sizes) grid.push_back({name, points});
             return planner::SizedTrace(std::move(grid), std::move(traces));
           }),
           py::arg("sizes"), py::arg("traces"))
      .def(
          "at", [](const planner::SizedTrace& sized, const std::vector<std::int64_t>& values) {
            return sized.at(values).trace;
          },
          py::arg("values"), "The trace at these sizes (one value per size, in the grid's order) (Note [Sized traces]).");
}

py::module_ plan_files() { return py::module_::import("stowage.plan.file_formats"); }

// A lifetime trace as its JSON document (stowage.plan.file_formats describes it), its fields in
// the file's order.
py::dict trace_document(const planner::LifetimeTrace& trace) {
  py::list ops;
  for (const planner::TraceOp& o : trace.ops) {
    ops.append(py::dict("name"_a = o.name, "module"_a = o.module, "phase"_a = planner::phase_name(o.phase),
                        "duration_ms"_a = o.duration_ms, "other_bytes"_a = o.other_bytes, "region"_a = o.region,
                        "region_op"_a = o.region_op, "io_bytes"_a = o.io_bytes, "in_use_bytes"_a = o.in_use_bytes));
  }
  py::list tensors;
  for (const planner::SavedTensor& t : trace.tensors) {
    tensors.append(py::dict("module"_a = t.module, "bytes"_a = t.bytes, "created"_a = t.created,
                            "last_forward_use"_a = t.last_forward_use, "first_backward_use"_a = t.first_backward_use,
                            "last_backward_use"_a = t.last_backward_use, "recompute_ms"_a = t.recompute_ms,
                            "recomputable"_a = t.recomputable, "offloadable"_a = t.offloadable,
                            "recompute_inputs"_a = t.recompute_inputs, "region"_a = t.region, "packs"_a = t.packs));
  }
  py::list regions;
  for (const planner::TraceRegion& r : trace.regions) {
    regions.append(py::dict("module"_a = r.module, "call"_a = r.call, "checkpointable"_a = r.checkpointable,
                            "ops"_a = r.ops, "inputs"_a = r.inputs));
  }
  const planner::CostModel& cost = trace.cost;
  return py::dict("format"_a = planner::kLifetimesFormat, "version"_a = planner::kFormatVersion, "ops"_a = ops,
                  "tensors"_a = tensors, "regions"_a = regions,
                  "cost"_a = py::dict("to_host_bytes_per_ms"_a = cost.to_host_bytes_per_ms,
                                      "to_device_bytes_per_ms"_a = cost.to_device_bytes_per_ms,
                                      "prefetch_depth"_a = cost.prefetch_depth),
                  "unconstrained_peak_bytes"_a = trace.unconstrained_peak_bytes, "kept_saves"_a = trace.kept_saves);
}

// The trace's parts, read-only in Python but for what a trial changes (recomputable, region,
// checkpointable, a copy's tensors, regions and cost): lists cross as copies.
void bind_values(py::module_& module) {
  py::enum_<planner::Phase>(module, "TracePhase")
      .value("forward", planner::Phase::kForward)
      .value("backward", planner::Phase::kBackward)
      .value("optimizer", planner::Phase::kOptimizer);
  using planner::TraceOp;
  py::class_<TraceOp> op(module, "TraceOp");
  op.def(py::init<std::string, std::string, planner::Phase, double, std::uint64_t, std::int32_t, std::int64_t,
                    std::uint64_t>(),
           py::arg("name"), py::arg("module"), py::arg("phase"), py::arg("duration_ms"), py::arg("other_bytes"),
           py::arg("region"), py::arg("in_use_bytes"), py::arg("io_bytes"))
      .def_readonly("name", &TraceOp::name);
  readonly(op, "module", &TraceOp::module, "phase", &TraceOp::phase, "duration_ms", &TraceOp::duration_ms,
           "other_bytes", &TraceOp::other_bytes, "region", &TraceOp::region, "region_op", &TraceOp::region_op,
           "in_use_bytes", &TraceOp::in_use_bytes, "io_bytes", &TraceOp::io_bytes);
  using planner::SavedTensor;
  py::class_<SavedTensor> tensor(module, "SavedTensor");
  tensor.def_readwrite("recomputable", &SavedTensor::recomputable).def_readwrite("region", &SavedTensor::region);
  readonly(tensor, "module", &SavedTensor::module, "bytes", &SavedTensor::bytes, "created", &SavedTensor::created,
           "last_forward_use", &SavedTensor::last_forward_use, "first_backward_use", &SavedTensor::first_backward_use,
           "last_backward_use", &SavedTensor::last_backward_use, "recompute_ms", &SavedTensor::recompute_ms,
           "offloadable", &SavedTensor::offloadable, "recompute_inputs", &SavedTensor::recompute_inputs, "packs",
           &SavedTensor::packs);
  using planner::TraceRegion;
  py::class_<TraceRegion> region(module, "TraceRegion");
  region.def_readwrite("checkpointable", &TraceRegion::checkpointable);
  readonly(region, "module", &TraceRegion::module, "call", &TraceRegion::call, "ops", &TraceRegion::ops, "inputs",
           &TraceRegion::inputs);
  using planner::LifetimeTrace;
  py::class_<LifetimeTrace> trace(module, "LifetimeTrace", "One recorded step (Note [Lifetime trace]).");
  trace.def_readwrite("tensors", &LifetimeTrace::tensors)
      .def_readwrite("regions", &LifetimeTrace::regions)
      .def_readwrite("cost", &LifetimeTrace::cost)
      .def("__copy__", [](const LifetimeTrace& self) { return self; })
      .def(
          "with_cost",
          [](LifetimeTrace self, const planner::CostModel& cost) {
            self.cost = cost;
            return self;
          },
          py::arg("cost"), "A copy of the trace under the cost model `cost`.")
      .def("document", &trace_document, "The trace as its JSON document (stowage.plan.file_formats).")
      .def(
          "save", [](const py::object& self, const py::object& path) {
            plan_files().attr("save_document")(self.attr("document")(), path);
          },
          py::arg("path"), "Writes the trace's file (stowage.plan.file_formats).");
  readonly(trace, "ops", &LifetimeTrace::ops, "kept_saves", &LifetimeTrace::kept_saves, "unconstrained_peak_bytes",
           &LifetimeTrace::unconstrained_peak_bytes);
  trace.def_property_readonly("compute_ms", &LifetimeTrace::compute_ms, "The ops' durations summed.");
  py::class_<planner::CostModel>(module, "CostModel")
      .def(py::init<double, double, std::size_t>(), py::arg("to_host_bytes_per_ms"),
           py::arg("to_device_bytes_per_ms"), py::arg("prefetch_depth") = 2)
      .def_readonly("to_host_bytes_per_ms", &planner::CostModel::to_host_bytes_per_ms)
      .def_readonly("to_device_bytes_per_ms", &planner::CostModel::to_device_bytes_per_ms)
      .def_readonly("prefetch_depth", &planner::CostModel::prefetch_depth);
}

// stowage.fit's choice (planner/share_search.hpp): choices cross as (share, micro-batch rows,
// parameters on the host) tuples.
using ChoiceTuple = std::tuple<double, std::int64_t, bool>;

planner::TimedChoices timed_choices(const std::map<ChoiceTuple, double>& step_ms) {
  planner::TimedChoices out;
  for (const auto& [choice, ms] : step_ms) {
    out.push_back({{std::get<0>(choice), std::get<1>(choice), std::get<2>(choice)}, ms});
  }
  return out;
}

std::optional<ChoiceTuple> as_tuple(const std::optional<planner::ShareChoice>& choice) {
  if (!choice) return std::nullopt;
  return ChoiceTuple{choice->fraction, choice->micro_rows, choice->parameters_on_host};
}

void bind_update_rates(py::module_& module) {
  using planner::UpdateRates;
  py::class_<UpdateRates> rates(module, "UpdateRates", "The optimizer's update times (Note [Update rates]).");
  rates.def(py::init<double, double, double, double, double, double>(), py::arg("host_ms_per_parameter"),
            py::arg("device_ms_per_parameter"), py::arg("host_ms_per_tensor") = 0.0,
            py::arg("device_ms_per_tensor") = 0.0, py::arg("streamed_ms_per_parameter") = 0.0,
            py::arg("streamed_ms_per_tensor") = 0.0);
  readonly(rates, "host_ms_per_parameter", &UpdateRates::host_ms_per_parameter, "device_ms_per_parameter",
           &UpdateRates::device_ms_per_parameter, "host_ms_per_tensor", &UpdateRates::host_ms_per_tensor,
           "device_ms_per_tensor", &UpdateRates::device_ms_per_tensor, "streamed_ms_per_parameter",
           &UpdateRates::streamed_ms_per_parameter, "streamed_ms_per_tensor", &UpdateRates::streamed_ms_per_tensor);
}

void bind_step_traces(py::module_& module) {
  py::class_<planner::StepTraces>(module, "StepTraces", "One micro-batch's lifetime trace by its rows.")
      .def(py::init<planner::LifetimeTrace, planner::CostModel>(), py::arg("trace"), py::arg("cost"))
      .def(py::init<planner::SizedTrace, std::vector<std::int64_t>, std::size_t, planner::CostModel>(),
           py::arg("sized"), py::arg("values"), py::arg("rows_size"), py::arg("cost"))
      .def("without_recompute", &planner::StepTraces::without_recompute, py::arg("regions"))
      .def("with_compute_scale", &planner::StepTraces::with_compute_scale, py::arg("scale"),
           "The same traces, every op's and recompute's time times `scale` (Note [Calibrated compute]).")
      .def_property_readonly("compute_scale", &planner::StepTraces::compute_scale)
      .def("at", &planner::StepTraces::at, py::arg("rows"), "The lifetime trace of a micro-batch of `rows` rows.");
}

void bind_fit_option(py::module_& module) {
  bind_step_traces(module);
  using planner::FitMemory;
  py::class_<FitMemory> memory(module, "FitMemory", "The device's figures for one fit (Note [Weighing fit's options]).");
  readonly(memory, "usable", &FitMemory::usable, "in_use", &FitMemory::in_use, "parameter_count",
           &FitMemory::parameter_count, "gradients", &FitMemory::gradients, "numels", &FitMemory::numels);
  memory.def(py::init<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                    std::vector<std::int64_t>, std::vector<std::int64_t>>(),
           py::kw_only(), py::arg("usable"), py::arg("in_use"), py::arg("parameter_count"), py::arg("gradients"),
           py::arg("foreach_temporary"), py::arg("largest_parameter"), py::arg("numels"), py::arg("state_bytes"))
      .def_property_readonly("states", &planner::FitMemory::states);
  py::class_<planner::FitHost>(module, "FitHost")
      .def(py::init<std::int64_t, std::int64_t, std::string, std::int64_t, std::int64_t>(),
           py::arg("bytes_per_parameter"), py::arg("available"), py::arg("limited_by"), py::arg("bucket_bytes") = 0,
           py::arg("staging_slots") = 0)
      .def_readonly("bytes_per_parameter", &planner::FitHost::bytes_per_parameter)
      .def("staging_bytes", &planner::FitHost::staging_bytes, py::arg("parameter_bytes"))
      .def_readonly("available", &planner::FitHost::available)
      .def_readonly("limited_by", &planner::FitHost::limited_by);
  bind_update_rates(module);
  using planner::FitBlocks;
  py::class_<FitBlocks> blocks(module, "FitBlocks", "The model's blocks and their parameters, as fit measured them.");
  blocks.def(py::init([](std::int64_t units, std::int64_t parameter_bytes, std::int64_t gradient_bytes,
                         std::int64_t state_bytes, std::int64_t trained_parameters, std::int64_t largest_unit_bytes,
                         std::int64_t largest_unit_gradient_bytes, std::vector<std::int64_t> unit_bytes,
                         planner::UnitGradients unit_gradients, bool states_counted_on_device,
                         std::int64_t trained_tensors) {
               return FitBlocks{units,          parameter_bytes,       gradient_bytes, state_bytes, trained_parameters,
                                largest_unit_bytes, largest_unit_gradient_bytes, std::move(unit_bytes),
                                std::move(unit_gradients), states_counted_on_device, trained_tensors};
             }),
             py::kw_only(), py::arg("units"), py::arg("parameter_bytes"), py::arg("gradient_bytes"),
             py::arg("state_bytes"), py::arg("trained_parameters"), py::arg("largest_unit_bytes"),
             py::arg("largest_unit_gradient_bytes"), py::arg("unit_bytes"), py::arg("unit_gradients"),
             py::arg("states_counted_on_device") = false, py::arg("trained_tensors") = 0);
  readonly(blocks, "units", &FitBlocks::units, "parameter_bytes", &FitBlocks::parameter_bytes, "unit_bytes",
           &FitBlocks::unit_bytes, "unit_gradients", &FitBlocks::unit_gradients);
  py::class_<planner::ParameterPrefetch> prefetch(module, "ParameterPrefetch",
                                                  "How far ahead the blocks' parameters come in, and what each depth "
                                                  "costs (planner/parameter_prefetch.hpp).");
  readonly(prefetch, "depth", &planner::ParameterPrefetch::depth, "exposed_ms", &planner::ParameterPrefetch::exposed_ms,
           "window_bytes", &planner::ParameterPrefetch::window_bytes);
  module.def(
      "parameter_prefetch",
      [](const planner::LifetimeTrace& trace, const std::vector<std::string>& unit_paths,
         const std::vector<std::int64_t>& unit_bytes, double to_device_bytes_per_ms, std::int64_t room_bytes) {
        return planner::choose_parameter_prefetch(planner::unit_passes(trace, unit_paths), unit_bytes,
                                                  to_device_bytes_per_ms, room_bytes);
      },
      py::arg("trace"), py::arg("unit_paths"), py::arg("unit_bytes"), py::arg("to_device_bytes_per_ms"),
      py::arg("room_bytes"),
      "The units' copies' exposed time and window by depth over `trace`'s passes, and the depth chosen under "
      "`room_bytes` (Note [Parameter prefetch depth]).");
  module.def("with_gradients_sent", &planner::with_gradients_sent, py::arg("trace"), py::arg("units"),
             "The trace with each unit's gradients off the device once backward has passed it "
             "(planner/gradients_sent.hpp).");
  py::enum_<planner::ParameterPlacement>(module, "ParameterPlacement")
      .value("DEVICE", planner::ParameterPlacement::kDevice)
      .value("HOST", planner::ParameterPlacement::kHost)
      .value("EITHER", planner::ParameterPlacement::kEither)
      .value("DEVICE_UNLESS_NONE_FITS", planner::ParameterPlacement::kDeviceUnlessNoneFits);
  using planner::FitOption;
  py::class_<FitOption> option(module, "FitOption");
  readonly(option, "fraction", &FitOption::fraction, "micro_rows", &FitOption::micro_rows, "micro_batches",
           &FitOption::micro_batches, "activation_budget", &FitOption::activation_budget, "device_state_bytes",
           &FitOption::device_state_bytes, "host_bytes", &FitOption::host_bytes, "update_ms", &FitOption::update_ms,
           "reason", &FitOption::reason, "solved", &FitOption::solved, "prefetch_depth", &FitOption::prefetch_depth);
  readonly(option, "device_bytes", &FitOption::device_bytes, "parameters_on_host", &FitOption::parameters_on_host,
           "window_bytes", &FitOption::window_bytes, "parameter_copy_ms", &FitOption::parameter_copy_ms,
           "parameter_prefetch", &FitOption::parameter_prefetch);
  option.def_readonly("decisions", &FitOption::decisions)
      .def_property_readonly("feasible", &FitOption::feasible)
      .def_property_readonly("keeps_everything", &FitOption::keeps_everything)
      .def_property_readonly("step_ms", &FitOption::step_ms);
}

void bind_fit_weighing(py::module_& module) {
  bind_fit_option(module);
  module.def(
      "weigh_fit",
      [](const planner::StepTraces& traces, const planner::FitMemory& memory, const planner::FitHost& host,
         const planner::UpdateRates& rates, const std::vector<std::pair<double, std::size_t>>& shares,
         const planner::ShareSearch& search, std::optional<std::int64_t> micro_count, bool foreach,
         std::int64_t reserve, const planner::FitBlocks& blocks, planner::ParameterPlacement placement) {
        planner::FitInputs inputs{traces, memory, host,    rates,  {},       search,
                                  micro_count, foreach, reserve, blocks, placement};
        for (const auto& [fraction, kept] : shares) inputs.shares.push_back({fraction, kept});
        const py::gil_scoped_release release;
        return planner::weigh_fit(inputs);
      },
      py::arg("traces"), py::arg("memory"), py::arg("host"), py::arg("rates"), py::arg("shares"), py::arg("search"),
      py::arg("micro_count"), py::arg("foreach"), py::arg("reserve"), py::arg("blocks") = planner::FitBlocks{},
      py::arg("placement") = planner::ParameterPlacement::kDevice,
      "fit's options weighed, in order (Note [Weighing fit's options]); shares: (fraction, parameters kept), "
      "largest first; placement: where the blocks' parameters may live.");
  py::class_<planner::ShareSearch>(module, "ShareSearch")
      .def(py::init<std::int64_t, std::optional<std::int64_t>, std::int64_t, int>(), py::arg("rows"),
           py::arg("micro_rows"), py::arg("smallest"), py::arg("extra_cuts"));
  module.def(
      "pick_choice",
      [](const std::map<ChoiceTuple, double>& step_ms, double tie, const std::optional<ChoiceTuple>& as_given) {
        std::optional<planner::ShareChoice> given;
        if (as_given) given = planner::ShareChoice{std::get<0>(*as_given), std::get<1>(*as_given), std::get<2>(*as_given)};
        return as_tuple(planner::pick_choice(timed_choices(step_ms), tie, given));
      },
      py::arg("step_ms"), py::arg("tie"), py::arg("as_given") = std::nullopt,
      "The choice fit takes from {(share, rows, parameters on the host): predicted ms}, or None; as_given, the "
      "choice that runs the step as given where it fits so, wins.");
  module.def(
      "agree_choice",
      [](const std::vector<std::map<ChoiceTuple, double>>& per_rank, double tie) {
        std::vector<planner::TimedChoices> ranks;
        for (const auto& rank : per_rank) ranks.push_back(timed_choices(rank));
        return as_tuple(planner::agree_choice(ranks, tie));
      },
      py::arg("per_rank"), py::arg("tie"), "One choice feasible on every rank, timed by its slowest, or None.");
}

}  // namespace

// What applying and printing a plan reads off its trace (planner/plan_lookup, plan_report,
// step_departures).
void bind_plan_bookkeeping(py::module_& module) {
  using planner::PlanLookup;
  py::class_<PlanLookup> lookup(module, "PlanLookup");
  readonly(lookup, "unit_of_save", &PlanLookup::unit_of_save, "kept_saves", &PlanLookup::kept_saves, "offloaded",
           &PlanLookup::offloaded, "checkpointed", &PlanLookup::checkpointed, "checkpointed_modules",
           &PlanLookup::checkpointed_modules, "recorded_calls", &PlanLookup::recorded_calls);
  module.def("plan_lookup", &planner::plan_lookup, py::arg("trace"), py::arg("decisions"),
             "What applying a checked plan looks up as the step runs (planner/plan_lookup.hpp).");
  using planner::ModuleBytes;
  py::class_<ModuleBytes> bytes(module, "ModuleBytes");
  readonly(bytes, "group", &ModuleBytes::group, "keep", &ModuleBytes::keep, "offload", &ModuleBytes::offload,
           "recompute", &ModuleBytes::recompute);
  module.def("bytes_by_module", &planner::bytes_by_module, py::arg("trace"), py::arg("decisions"),
             "The saved bytes under each decision per module group (blocks.3.mlp.fc1 -> blocks.*.mlp), by group.");
  using planner::ReferencePlan;
  py::class_<ReferencePlan> reference(module, "ReferencePlan");
  readonly(reference, "name", &ReferencePlan::name, "decisions", &ReferencePlan::decisions, "simulation",
           &ReferencePlan::simulation);
  module.def("reference_plans", &planner::reference_plans, py::arg("trace"),
             "No change, full checkpointing and offload everything, each with its Simulation.");
  using planner::StepDepartures;
  py::class_<StepDepartures>(module, "StepDepartures", "Where a plan's steps depart from its trace, told once each way.")
      .def(py::init<>())
      .def("begin_step", &StepDepartures::begin_step)
      .def("note", &StepDepartures::note, py::arg("what"))
      .def("end_step", &StepDepartures::end_step, "Counts a finished step; the warning to give, or None.")
      .def_property_readonly("this_step", &StepDepartures::this_step)
      .def_property_readonly("steps", &StepDepartures::steps)
      .def_property_readonly("departed_steps", &StepDepartures::departed_steps);
  py::class_<planner::RegionPolicy>(module, "RegionPolicy", "Which ops of a checkpointed block call keep their outputs.")
      .def(py::init<std::vector<std::string>, std::set<std::int32_t>, StepDepartures&, std::string>(),
           py::arg("recorded_ops"), py::arg("kept"), py::arg("departures"), py::arg("where"), py::keep_alive<1, 4>())
      .def("keep", &planner::RegionPolicy::keep, py::arg("op"),
           "Whether the forward's next op, by its name, keeps its outputs (else it is recomputed).");
}

void bind_planner(py::module_& module) {
  py::enum_<planner::Decision>(module, "Decision", "What a plan does with one saved tensor.")
      .value("keep", planner::Decision::kKeep)
      .value("offload", planner::Decision::kOffload)
      .value("recompute", planner::Decision::kRecompute);
  bind_values(module);
  bind_plan_bookkeeping(module);
  bind_results(module);
  bind_recording(module);
  bind_fit_weighing(module);
  module.def(
      "plan_simulate",
      [](const planner::LifetimeTrace& trace, const planner::Plan& plan, std::optional<std::uint64_t> ceiling) {
        planner::Simulator simulator(trace, trace.cost, ceiling.value_or(planner::Simulator::kNoCeiling));
        return simulator.simulate(plan);
      },
      py::arg("trace"), py::arg("decisions"), py::arg("ceiling") = py::none(),
      "The Simulation of a plan (one Decision per saved tensor) under the trace's cost model, run under an "
      "allocated ceiling of `ceiling` bytes when given.");
  module.def(
      "plan_solve",
      [](const planner::LifetimeTrace& trace, std::uint64_t budget, bool exact,
         std::optional<std::size_t> shallowest_prefetch_depth) {
        planner::DepthSolution found;
        {
          const py::gil_scoped_release release;
          found = planner::solve_over_depths(trace, trace.cost, budget, exact,
                                             shallowest_prefetch_depth.value_or(trace.cost.prefetch_depth));
        }
        planner::LifetimeTrace planned = trace;
        planned.cost.prefetch_depth = found.prefetch_depth;
        return BudgetPlan{std::move(planned), std::move(found.solution.plan), found.solution.simulation,
                          found.solution.fits, found.prefetch_depth};
      },
      py::arg("trace"), py::arg("budget"), py::arg("exact") = false, py::arg("shallowest_prefetch_depth") = py::none(),
      "A BudgetPlan: the fastest plan found whose peak fits the budget under the trace's cost model, searched down "
      "to the shallowest prefetch depth (Note [Prefetch depth]); the lowest peak found when none fits.");
}

}  // namespace stowage::python
