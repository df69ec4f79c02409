// stowage.fit's weighing: every share of the optimizer's states kept on the device and every
// micro-batch size it searches (Note [Choosing a share] in share_search.hpp), each solved by the
// planner under the memory it leaves, with the memory arithmetic and the predicted step time.
//
// Note [Weighing fit's options]
// Between steps the device holds what was in use when fit ran (parameters, buffers, what the
// caller keeps) and the states of the parameters a share keeps (the leading ones in the
// optimizer's order, as the offloaded optimizer splits them: fit counts them, torch-side). A
// step adds what its lifetime trace records, which the plan bounds: its budget is the usable
// memory less those, less the `reserve` a tried step added beyond its plan, and less the
// gradients where the batch runs as micro-batches (they are there from the second one's start).
// The optimizer's step holds the gradients, the kept states and a temporary: the multi-tensor
// path (foreach, torch's optimizer alone) one copy of every parameter's, else the largest
// parameter's, for the share kept. The host holds the offloaded parameters' states, the
// offloaded optimizer's staging ring (up to three buckets, however many there are) and the
// plan's offloaded activations (all on the host at once where the step turns). An option is
// feasible when the host holds them, a plan fits, and the optimizer's step fits. Its step time
// is the micro-batches' planned steps plus the update: the kept share's parameters at the
// device's measured rates (Note [Update rates]), then the rest at the rates measured of the
// offloaded optimizer's step() itself, or where they were not, as modelled here: as it streams (Note
// [Staged buckets] in offload/adam_buckets.hpp): each bucket's parameters and gradients cross to
// the host, are updated there at the host's rate and the parameters cross back, one bucket's
// copy out overlapping the last one's update and the one before's write-back, so the slowest of
// the three takes the whole, plus the first bucket's copy out and the last one's write-back.
//
// Where the blocks' parameters live is a dimension of its own (`placement`): on the device, as
// built, or on the host (stowage.offload.parameters over the model's blocks, Note [Parameters off
// the device] in offload/parameter_schedule.hpp), weighed with the whole share (1.0) alone: each
// parameter is updated where it lives, the blocks' on the host with their states there. Where the
// optimizer has an offloaded twin (Adam, AdamW) fit runs it with that share: the blocks'
// parameters are updated in place by the host kernel (python/stowage/offload/resident_adam.py),
// at the host's measured rate, and torch's multi-tensor step (foreach) runs over the device's
// parameters alone, so its temporary leaves the blocks' gradients out. Otherwise the factory's
// optimizer updates them on the host with torch's CPU kernels, timed at the same rate (a lower
// bound: torch's CPU update is not measured). Then
// the device no longer holds the blocks' parameters between steps, nor their gradients (each goes
// to the host as it is made), nor their states; each step adds a window: the units' parameters the
// schedule holds at the prefetch depth chosen (Note [Parameter prefetch depth] in
// planner/parameter_prefetch.hpp: the fewest units ahead whose copies wait least, under the room
// left with no activations) and the largest unit's gradients while they are made, kept from the
// plan's budget; where no plan fits at that depth, each shallower one is tried, the first that fits
// kept. The plan is solved on the trace without each unit's gradients once backward has passed it
// (planner/gradients_sent.hpp).
// The host holds the blocks' parameters, gradients and states besides the plan's offloaded
// activations (the states stay on the device's side where the device counts host tensors: CPU
// mode with the factory's optimizer; the twin keeps them in its host store, which CPU mode's device
// does not count). Each micro-batch copies every unit's parameters in twice (forward, backward) and
// its gradients out: the copies in wait as the simulated passes at the chosen depth say; the
// gradients' copies out are taken as not overlapped at all (a bound: they leave on the engine's
// device-to-host stream as backward makes them, Note [Gradients in flight] in
// offload/gradient_queue.hpp, but how much of them the compute hides is not measured). The blocks'
// trained parameters
// update at the host's rate, the rest at the device's. An option with the parameters on the host
// wins only by its predicted step: within the tie, the parameters stay on the device (Note
// [Choosing a share]).
//
// Contract: pure functions of their inputs (the solver runs on the calling thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "planner/gradients_sent.hpp"
#include "planner/plan.hpp"
#include "planner/share_search.hpp"
#include "planner/simulator.hpp"
#include "planner/step_traces.hpp"

namespace stowage::planner {

// The device's figures for one fit, in bytes: the model and optimizer as built.
struct FitMemory {
  std::int64_t usable = 0;  // what the device may hold in all, less fit's margin
  std::int64_t in_use = 0;  // when fit ran: parameters, buffers, the example batch
  std::int64_t parameter_count = 0;  // trainable parameters
  std::int64_t gradients = 0;        // one gradient per trainable parameter, in its dtype
  std::int64_t foreach_temporary = 0;
  std::int64_t largest_parameter = 0;
  std::vector<std::int64_t> numels;       // every parameter, in the optimizer's order
  std::vector<std::int64_t> state_bytes;  // each one's states (none for a frozen one)

  std::int64_t states() const;
  // The states of the first `kept` parameters.
  std::int64_t states_on_device(std::size_t kept) const;
  // Parameters with states past the first `kept`.
  std::int64_t offloaded_parameters(std::size_t kept) const;
  // The tensors with states among parameters [begin, end): each is one tensor the optimizer steps.
  std::int64_t tensors_with_states(std::size_t begin, std::size_t end) const;
};

// The host's side: what an offloaded parameter takes there, what the process may take, and which limit that is.
struct FitHost {
  std::int64_t bytes_per_parameter = 0;
  std::int64_t available = 0;
  std::string limited_by;
  // The offloaded optimizer's staging ring (Note [Staged buckets]): up to `staging_slots` slots,
  // each one bucket's parameters and gradients, a bucket at most `bucket_bytes` of parameters (the
  // part of the stream that is not overlapped).
  std::int64_t bucket_bytes = 0;
  std::int64_t staging_slots = 0;

  // The ring's bytes where `parameter_bytes` of parameters are offloaded.
  std::int64_t staging_bytes(std::int64_t parameter_bytes) const;
};

// The optimizer's measured update time on each side, as the implementation that runs there
// steps (Note [Update rates]): a time a parameter (an element) and a time a tensor.
//
// Note [Update rates]
// An update's time is a line in what it steps: a time per element (the kernel's memory traffic)
// and a time per tensor (torch's for-loop runs a dozen ops a tensor, its multi-tensor and fused
// paths a launch per chunk of tensors, the host update a Python call and a kernel call a tensor).
// Each side is timed where fit runs, as the step will run it (python/stowage/fitting/measuring.py):
// the device's with the factory's optimizer (its class and flags: torch picks the same
// implementation for the same device and flags), the host's as parameters living on the host are
// updated, and the offloaded share's as the offloaded optimizer's step() streams it, whole. Each
// line goes through two differences: many small tensors against one (the time a tensor) and four
// tensors of the model's typical size against one (the time an element, at the size whose passes
// stay in or spill out of the caches as the model's do). A rate per element alone misses a
// for-loop's cost a tensor, most of its update on a model of many small tensors.
struct UpdateRates {
  double host_ms_per_parameter = 0;
  double device_ms_per_parameter = 0;
  double host_ms_per_tensor = 0;
  double device_ms_per_tensor = 0;
  // The offloaded share's step() as it streams, timed whole (its copies, host update and write-back
  // overlapping as they do); 0 where not measured: modelled from the host's rates and the copies.
  double streamed_ms_per_parameter = 0;
  double streamed_ms_per_tensor = 0;

  double host_ms(std::int64_t parameters, std::int64_t tensors) const;
  double device_ms(std::int64_t parameters, std::int64_t tensors) const;
  bool streamed_measured() const noexcept { return streamed_ms_per_parameter > 0 || streamed_ms_per_tensor > 0; }
};

// A share of the states on the device and the parameters it keeps there (their count, leading).
struct FitShare {
  double fraction = 1.0;
  std::size_t kept_parameters = 0;
};

// The model's blocks (stowage.offload.parameters' units) and their parameters, as fit measured them.
struct FitBlocks {
  std::int64_t units = 0;
  std::int64_t parameter_bytes = 0;     // every parameter of the units, trained or frozen
  std::int64_t gradient_bytes = 0;      // one gradient per trained parameter of the units, in its dtype
  std::int64_t state_bytes = 0;         // the optimizer's states of the units' trained parameters
  std::int64_t trained_parameters = 0;  // the units' trained parameters, updated on the host
  std::int64_t largest_unit_bytes = 0;  // the largest unit's parameters
  std::int64_t largest_unit_gradient_bytes = 0;
  std::vector<std::int64_t> unit_bytes;  // each unit's parameters, in the order of `unit_gradients`
  UnitGradients unit_gradients;         // each unit's module path and its gradients' bytes
  // The optimizer's states of host parameters are plain host tensors the device's memory counts
  // too (CPU mode's simulated device is the process's CPU memory): they stay on the device's side.
  bool states_counted_on_device = false;
  std::int64_t trained_tensors = 0;  // the units' trained parameters as tensors (each once)
};

// Where fit may keep the blocks' parameters (fit's `offload_parameters`: False, True, "auto",
// None): on the device; on the host; either, the faster predicted step winning; on the device
// unless no option fits there, then either (the host options weighed only then).
enum class ParameterPlacement { kDevice, kHost, kEither, kDeviceUnlessNoneFits };

struct FitInputs {
  StepTraces traces;
  FitMemory memory;
  FitHost host;
  UpdateRates rates;
  std::vector<FitShare> shares;  // largest first; those keeping the same states weighed once
  ShareSearch search;
  std::optional<std::int64_t> micro_count;  // the micro-batches the size asked for runs as
  bool foreach = false;                     // torch's optimizer steps through its multi-tensor path
  std::int64_t reserve = 0;                 // device bytes kept from every plan
  FitBlocks blocks;
  ParameterPlacement placement = ParameterPlacement::kDevice;
};

struct FitOption {
  double fraction = 1.0;
  std::int64_t micro_rows = 0;
  std::int64_t micro_batches = 1;
  std::int64_t activation_budget = 0;
  std::int64_t device_state_bytes = 0;
  std::int64_t optimizer_peak = 0;  // device bytes during the optimizer's step
  std::int64_t host_bytes = 0;      // offloaded states (and parameters), and the plan's offloaded activations
  std::int64_t device_bytes = 0;    // held between steps: what was in use (less parameters moved) and states
  bool parameters_on_host = false;  // the blocks' parameters live on the host
  std::int64_t window_bytes = 0;    // with them there: the device bytes a step adds for their copies
  std::size_t parameter_prefetch = 0;  // and the units whose parameters come in ahead of the one running
  double update_ms = 0;
  double parameter_copy_ms = 0;     // the parameters' and gradients' copies not overlapped, the whole step's
  std::string reason;               // why it does not fit, or ""
  bool solved = false;              // a plan was solved (decisions, prefetch_depth and prediction hold)
  Plan decisions;
  std::size_t prefetch_depth = 0;
  Simulation prediction;            // the plan's step under its budget as ceiling

  bool feasible() const noexcept { return reason.empty(); }
  bool keeps_everything() const noexcept;
  double step_ms() const noexcept;
};

// The options weighed, in the order they are listed (Note [Choosing a share]).
std::vector<FitOption> weigh_fit(const FitInputs& inputs);

}  // namespace stowage::planner
