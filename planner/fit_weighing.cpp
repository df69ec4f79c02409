#include "planner/fit_weighing.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "planner/parameter_prefetch.hpp"
#include "planner/prefetch_search.hpp"

namespace stowage::planner {

std::int64_t FitMemory::states() const { return std::accumulate(state_bytes.begin(), state_bytes.end(), std::int64_t{0}); }

std::int64_t FitMemory::states_on_device(std::size_t kept) const {
  const auto end = state_bytes.begin() + static_cast<std::ptrdiff_t>(std::min(kept, state_bytes.size()));
  return std::accumulate(state_bytes.begin(), end, std::int64_t{0});
}

std::int64_t FitMemory::tensors_with_states(std::size_t begin, std::size_t end) const {
  std::int64_t count = 0;
  for (std::size_t i = begin; i < end && i < state_bytes.size(); ++i) count += state_bytes[i] != 0 ? 1 : 0;
  return count;
}

double UpdateRates::host_ms(std::int64_t parameters, std::int64_t tensors) const {
  return static_cast<double>(parameters) * host_ms_per_parameter + static_cast<double>(tensors) * host_ms_per_tensor;
}

double UpdateRates::device_ms(std::int64_t parameters, std::int64_t tensors) const {
  return static_cast<double>(parameters) * device_ms_per_parameter +
         static_cast<double>(tensors) * device_ms_per_tensor;
}

std::int64_t FitMemory::offloaded_parameters(std::size_t kept) const {
  std::int64_t count = 0;
  for (std::size_t i = kept; i < numels.size() && i < state_bytes.size(); ++i) {
    if (state_bytes[i] != 0) count += numels[i];
  }
  return count;
}

bool FitOption::keeps_everything() const noexcept {
  return solved && std::all_of(decisions.begin(), decisions.end(), [](Decision d) { return d == Decision::kKeep; });
}

double FitOption::step_ms() const noexcept {
  return static_cast<double>(micro_batches) * prediction.step_ms + parameter_copy_ms + update_ms;
}

namespace {

std::string bytes_text(std::int64_t bytes) { return format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 0))); }

std::string host_refusal(const char* what, std::int64_t needed, const FitHost& host) {
  return std::string("the host cannot hold the offloaded ") + what + ": " + bytes_text(needed) + " needed, " +
         bytes_text(host.available) + " available (" + host.limited_by + ")";
}

std::int64_t offloaded_bytes(const LifetimeTrace& trace, const Plan& plan) {
  std::int64_t bytes = 0;
  for (std::size_t t = 0; t < plan.size(); ++t) {
    if (plan[t] == Decision::kOffload) bytes += static_cast<std::int64_t>(trace.tensors[t].bytes);
  }
  return bytes;
}

// The offloaded share's update as step() streams it (Note [Weighing fit's options]): the
// parameters' and gradients' copies out (gradients in the parameters' dtype), the host update and
// the write-back overlap, the slowest taking the whole; one bucket's copy out and write-back are
// exposed at the ends.
double streamed_update_ms(const FitInputs& in, std::size_t kept) {
  const FitMemory& memory = in.memory;
  const std::int64_t offloaded = memory.offloaded_parameters(kept);
  const double parameter_bytes =  // gradients are in their parameters' dtype
      memory.parameter_count > 0 ? static_cast<double>(offloaded) * static_cast<double>(memory.gradients) /
                                       static_cast<double>(memory.parameter_count)
                                 : 0.0;
  if (parameter_bytes <= 0) return 0.0;
  const std::int64_t tensors = memory.tensors_with_states(kept, memory.state_bytes.size());
  if (in.rates.streamed_measured()) {
    return static_cast<double>(offloaded) * in.rates.streamed_ms_per_parameter +
           static_cast<double>(tensors) * in.rates.streamed_ms_per_tensor;
  }
  const CostModel& cost = in.traces.cost();
  const double host_ms = in.rates.host_ms(offloaded, tensors);
  const double out_ms = 2 * parameter_bytes / cost.to_host_bytes_per_ms;
  const double back_ms = parameter_bytes / cost.to_device_bytes_per_ms;
  const double bucket = std::min(parameter_bytes, static_cast<double>(in.host.bucket_bytes));
  const double ends_ms = 2 * bucket / cost.to_host_bytes_per_ms + bucket / cost.to_device_bytes_per_ms;
  return std::max({host_ms, out_ms, back_ms}) + ends_ms;
}

// What an option holds where, before its plan (Note [Weighing fit's options]).
struct Placed {
  std::int64_t in_use = 0;      // on the device between steps, states aside
  std::int64_t gradients = 0;   // on the device after backward
  std::int64_t states = 0;      // on the device
  std::int64_t window = 0;      // added on the device by each step's parameter copies
  std::int64_t host = 0;        // on the host, activations aside
  double update_ms = 0;
};

Placed place(const FitInputs& in, const FitShare& share, bool parameters_on_host) {
  const FitMemory& memory = in.memory;
  Placed placed{memory.in_use, memory.gradients, memory.states_on_device(share.kept_parameters), 0, 0, 0.0};
  if (parameters_on_host) {  // each parameter's states where it lives, the blocks' updated by the host kernel
    const FitBlocks& blocks = in.blocks;
    placed.in_use -= blocks.parameter_bytes;
    placed.gradients -= blocks.gradient_bytes;
    const std::int64_t states_moved = blocks.states_counted_on_device ? 0 : blocks.state_bytes;
    placed.states -= states_moved;
    placed.host = blocks.parameter_bytes + blocks.gradient_bytes + states_moved;
    const std::int64_t tensors = memory.tensors_with_states(0, memory.state_bytes.size());
    placed.update_ms = in.rates.device_ms(memory.parameter_count - blocks.trained_parameters,
                                          std::max<std::int64_t>(tensors - blocks.trained_tensors, 0)) +
                       in.rates.host_ms(blocks.trained_parameters, blocks.trained_tensors);
    return placed;
  }
  const std::int64_t offloaded = memory.offloaded_parameters(share.kept_parameters);
  const std::int64_t parameter_bytes =  // offloaded (gradients are in their parameters' dtype)
      memory.parameter_count > 0 ? offloaded * memory.gradients / memory.parameter_count : 0;
  placed.host = offloaded * in.host.bytes_per_parameter + in.host.staging_bytes(parameter_bytes);
  // The kept share as kept (whole parameters, the leading ones), not its fraction of the count.
  placed.update_ms = in.rates.device_ms(memory.parameter_count - offloaded,
                                        memory.tensors_with_states(0, share.kept_parameters)) +
                     streamed_update_ms(in, share.kept_parameters);
  return placed;
}

// The blocks' parameters' copies a step waits for (Note [Weighing fit's options]), each
// micro-batch's: the copies in as the passes wait for them at the depth, the gradients out.
double parameter_copy_ms(const FitInputs& in, const ParameterPrefetch& prefetch) {
  const double out_ms = static_cast<double>(in.blocks.gradient_bytes) / in.traces.cost().to_host_bytes_per_ms;
  return prefetch.chosen_exposed_ms() + out_ms;
}

// How far ahead the blocks' parameters come in (Note [Parameter prefetch depth]), under `room`:
// the device bytes left for the window and the activations.
ParameterPrefetch parameter_prefetch(const FitInputs& in, const LifetimeTrace& trace, std::int64_t room) {
  std::vector<std::string> paths;
  for (const auto& [path, gradient_bytes] : in.blocks.unit_gradients) paths.push_back(path);
  return choose_parameter_prefetch(unit_passes(trace, paths), in.blocks.unit_bytes,
                                   in.traces.cost().to_device_bytes_per_ms,
                                   room - in.blocks.largest_unit_gradient_bytes);
}

// One option as `placed`: its memory arithmetic, and its plan on `trace` where the memory leaves
// room for one (Note [Weighing fit's options]); `prefetch` where the parameters are on the host.
FitOption weigh_placed(const FitInputs& in, const FitShare& share, const Placed& placed, const LifetimeTrace& trace,
                       std::int64_t micro_rows, std::int64_t micro_batches, const ParameterPrefetch* prefetch) {
  const FitMemory& memory = in.memory;
  const bool parameters_on_host = prefetch != nullptr;
  FitOption option;
  option.fraction = share.fraction;
  option.micro_rows = micro_rows;
  option.micro_batches = micro_batches;
  option.parameters_on_host = parameters_on_host;
  option.window_bytes = placed.window;
  option.parameter_prefetch = parameters_on_host ? prefetch->depth : 0;
  option.device_state_bytes = placed.states;
  option.device_bytes = placed.in_use + placed.states;
  option.activation_budget = memory.usable - placed.in_use - placed.states - placed.window - in.reserve;
  if (micro_batches > 1) option.activation_budget -= placed.gradients;
  option.host_bytes = placed.host;
  const bool foreach = in.foreach && share.fraction == 1.0;
  std::int64_t temporary_bytes = foreach ? memory.foreach_temporary : memory.largest_parameter;
  if (foreach && parameters_on_host && !in.blocks.states_counted_on_device) {
    // torch's multi-tensor step runs over the parameters on the device alone: the blocks' are the host's
    temporary_bytes = std::max<std::int64_t>(temporary_bytes - in.blocks.gradient_bytes, 0);
  }
  const auto temporary = static_cast<double>(temporary_bytes);
  option.optimizer_peak = placed.in_use + placed.gradients + placed.states +
                          static_cast<std::int64_t>(temporary * share.fraction);
  option.update_ms = placed.update_ms;
  const char* held = parameters_on_host ? "parameters, gradients and states" : "states";
  if (option.host_bytes > in.host.available) {
    option.reason = host_refusal(held, option.host_bytes, in.host);
    return option;
  }
  if (option.activation_budget <= 0) {
    option.reason = parameters_on_host ? "what stays on the device and the parameters' window fill it"
                                       : "the states alone fill the device";
    return option;
  }
  const auto budget = static_cast<std::uint64_t>(option.activation_budget);
  const DepthSolution found = solve_over_depths(trace, in.traces.cost(), budget, false, 0);
  CostModel at_depth = in.traces.cost();
  at_depth.prefetch_depth = found.prefetch_depth;
  option.solved = true;
  option.decisions = found.solution.plan;
  option.prefetch_depth = found.prefetch_depth;
  option.prediction = Simulator(trace, at_depth, budget).simulate(option.decisions);
  if (parameters_on_host) {
    option.parameter_copy_ms = static_cast<double>(micro_batches) * parameter_copy_ms(in, *prefetch);
  }
  if (option.prediction.peak_bytes > budget) {
    option.reason = "no plan fits: the lowest step peak found is " + format_bytes(option.prediction.peak_bytes);
    return option;
  }
  option.host_bytes += offloaded_bytes(trace, option.decisions);
  if (option.host_bytes > in.host.available) {
    option.reason = host_refusal(parameters_on_host ? "parameters, gradients, states and activations"
                                                    : "states and activations",
                                 option.host_bytes, in.host);
  } else if (option.optimizer_peak > memory.usable) {
    option.reason = "the optimizer's step does not fit";
  }
  return option;
}

// Whether `option` was refused for want of device room for its activations (a smaller window may leave it).
bool short_of_room(const FitOption& option) {
  return option.activation_budget <= 0 ||
         (option.solved && option.prediction.peak_bytes > static_cast<std::uint64_t>(option.activation_budget));
}

// One option, and with the parameters on the host its prefetch depth: the one chosen, or where no
// plan fits there, the first shallower one where one does (Note [Weighing fit's options]).
FitOption weigh_option(const FitInputs& in, const FitShare& share, bool parameters_on_host, std::int64_t micro_rows,
                       std::int64_t micro_batches) {
  Placed placed = place(in, share, parameters_on_host);
  if (!parameters_on_host) {
    return weigh_placed(in, share, placed, in.traces.at(micro_rows), micro_rows, micro_batches, nullptr);
  }
  const LifetimeTrace trace = with_gradients_sent(in.traces.at(micro_rows), in.blocks.unit_gradients);
  const std::int64_t room = in.memory.usable - placed.in_use - placed.states - in.reserve -
                            (micro_batches > 1 ? placed.gradients : 0);
  ParameterPrefetch prefetch = parameter_prefetch(in, trace, room);
  for (;; --prefetch.depth) {
    placed.window = prefetch.chosen_window_bytes() + in.blocks.largest_unit_gradient_bytes;
    FitOption option = weigh_placed(in, share, placed, trace, micro_rows, micro_batches, &prefetch);
    if (option.feasible() || prefetch.depth == 0 || !short_of_room(option)) return option;
  }
}

// The shares that place states differently: of shares keeping the same states only the smallest
// is weighed (the one that names what is kept); torch's own optimizer (1.0) is never replaced.
std::vector<FitShare> distinct(const std::vector<FitShare>& shares, const FitMemory& memory) {
  std::map<std::int64_t, FitShare> by_states;
  for (const FitShare& share : shares) {  // largest first
    const auto [found, added] = by_states.try_emplace(memory.states_on_device(share.kept_parameters), share);
    if (!added && found->second.fraction != 1.0) found->second = share;
  }
  std::vector<FitShare> out;
  for (const auto& [states, share] : by_states) out.push_back(share);
  std::sort(out.begin(), out.end(), [](const FitShare& a, const FitShare& b) { return a.fraction > b.fraction; });
  return out;
}

}  // namespace

std::int64_t FitHost::staging_bytes(std::int64_t parameter_bytes) const {
  if (parameter_bytes <= 0 || bucket_bytes <= 0) return 0;
  const std::int64_t buckets = (parameter_bytes + bucket_bytes - 1) / bucket_bytes;
  return 2 * std::min(parameter_bytes, bucket_bytes) * std::min(buckets, staging_slots);
}

// The placements weighed, the device's first: the parameters on the device unless forced to the
// host, on the host where asked and the model has blocks with parameters (kDeviceUnlessNoneFits:
// where no option with them on the device is feasible, weigh_fit's loop stops before the host).
std::vector<bool> placements(const FitInputs& in) {
  const bool can = in.blocks.units > 0 && in.blocks.parameter_bytes > 0;
  switch (in.placement) {
    case ParameterPlacement::kDevice: return {false};
    case ParameterPlacement::kHost: return {true};
    case ParameterPlacement::kEither:
    case ParameterPlacement::kDeviceUnlessNoneFits:
      return can ? std::vector<bool>{false, true} : std::vector<bool>{false};
  }
  return {false};
}

std::vector<FitOption> weigh_fit(const FitInputs& in) {
  STOWAGE_CHECK(!in.shares.empty(), "weigh_fit: no share to weigh");
  STOWAGE_CHECK(in.placement != ParameterPlacement::kHost || (in.blocks.units > 0 && in.blocks.parameter_bytes > 0),
                "weigh_fit: parameters on the host, but the model has no block with parameters");
  STOWAGE_CHECK(in.placement == ParameterPlacement::kDevice ||
                    (in.blocks.unit_bytes.size() == static_cast<std::size_t>(in.blocks.units) &&
                     in.blocks.unit_gradients.size() == in.blocks.unit_bytes.size()),
                "weigh_fit: ", in.blocks.units, " blocks, ", in.blocks.unit_bytes.size(), " blocks' bytes and ",
                in.blocks.unit_gradients.size(), " blocks' paths");
  STOWAGE_CHECK(in.placement == ParameterPlacement::kDevice || in.shares.front().fraction == 1.0,
                "weigh_fit: the parameters on the host are weighed with the factory's optimizer, share 1.0 first");
  std::vector<FitOption> listed;
  for (const bool on_host : placements(in)) {
    const bool device_fits = std::any_of(listed.begin(), listed.end(), [](const FitOption& o) { return o.feasible(); });
    if (on_host && in.placement == ParameterPlacement::kDeviceUnlessNoneFits && device_fits) break;
    // With the parameters on the host the factory's optimizer updates them there: its share alone.
    const std::vector<FitShare> shares = on_host ? std::vector<FitShare>{in.shares.front()} : distinct(in.shares, in.memory);
    std::vector<double> fractions;
    for (const FitShare& share : shares) fractions.push_back(share.fraction);
    std::map<std::pair<double, std::int64_t>, FitOption> solved;
    const EvaluateOption evaluate = [&](double fraction, std::int64_t micro_rows, std::int64_t micro_batches) {
      if (in.micro_count && in.search.micro_rows && micro_rows == *in.search.micro_rows) micro_batches = *in.micro_count;
      const auto share = std::find_if(shares.begin(), shares.end(), [&](const FitShare& s) { return s.fraction == fraction; });
      FitOption option = weigh_option(in, *share, on_host, micro_rows, micro_batches);
      const WeighedOption weighed{option.feasible(), option.keeps_everything(), option.feasible() ? option.step_ms() : 0.0};
      solved.insert_or_assign({fraction, micro_rows}, std::move(option));
      return weighed;
    };
    for (const ShareChoice& choice : weigh_shares(fractions, in.search, evaluate)) {
      listed.push_back(solved.at({choice.fraction, choice.micro_rows}));
    }
  }
  return listed;
}

}  // namespace stowage::planner
