// One training step as the planner sees it: the ops in execution order with their measured
// durations and the device memory that is not saved activations, and every tensor saved for
// backward with when it lives (Note [Lifetime trace]).
//
// Note [Lifetime trace]
// Ops are numbered in the order they ran: forward first, then backward (an optimizer step, when
// profiled, after backward). A saved tensor is created by op `created` (its producer), used by
// forward for the last time at op `last_forward_use`, needed by backward first at op
// `first_backward_use` and last at `last_backward_use`; kept, it is live over all of that.
// `recompute_ms` is the time its producer takes again, and `recompute_inputs` the saved tensors
// that producer reads (each of a lower index: recorded before it), so recomputing it needs them
// on the device too (kept, reloaded, or recomputed first: the chain). `other_bytes` at an op
// is the device memory in use then that no decision changes (parameters, gradients, optimizer
// states, the op's own temporaries). Times are milliseconds, sizes bytes.
//
// A tensor of a checkpoint region (`region` >= 0: the runtime recomputes by running a module again
// under selective checkpointing) is made again together with every other recomputed tensor of its
// region, before the first backward op that needs any saved tensor of the region; and a region
// either recomputes some of its tensors or offloads some, never both (a checkpoint keeps what it
// saves in storage of its own, out of reach of the offloader). A tensor of no region (kNoRegion) is
// made again alone, before the first op that needs it.
//
// A recorded trace also carries what the runtime finds tensors by and what a file holds beside
// them: where autograd saved each tensor (`packs`), the saves no decision moves (`kept_saves`:
// parameters, tensors made before the step), the checkpoint regions (each op's place in its
// region, `region_op`), the cost model it was measured under, and the step's unconstrained peak
// (planner/derived_quantities.hpp). The solvers and the simulator read the ops and tensors alone.
//
// Contract: a value type; validate() checks every rule above and names the first one broken.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "planner/cost_model.hpp"

namespace stowage::planner {

enum class Phase : std::uint8_t { kForward, kBackward, kOptimizer };

// A phase as the trace file and messages name it.
constexpr const char* phase_name(Phase phase) noexcept {
  return phase == Phase::kForward ? "forward" : phase == Phase::kBackward ? "backward" : "optimizer";
}

inline constexpr std::int32_t kNoRegion = -1;

// The measured figures `other_bytes` and each tensor's `recompute_ms` follow from
// (planner/derived_quantities.hpp): `in_use_bytes`, the device memory in use during the op
// relative to the step's start (below 0 where the step freed what it began with), and `io_bytes`,
// the bytes of its tensor arguments and results (what its time follows as sizes change).
struct TraceOp {
  std::string name;    // e.g. "aten::mm"
  std::string module;  // the module path that ran it, e.g. "blocks.3.mlp"
  Phase phase = Phase::kForward;
  double duration_ms = 0;
  std::uint64_t other_bytes = 0;
  std::int32_t region = kNoRegion;  // the checkpoint region a forward op ran in
  std::int64_t in_use_bytes = 0;
  std::uint64_t io_bytes = 0;
  std::int32_t region_op = -1;  // its place among its region's ops
};

// Where autograd saved a tensor: (module path, the module's call number, the save's number
// within that call), which is how a plan finds the tensor again in a later step.
using SaveSite = std::tuple<std::string, std::int64_t, std::int64_t>;

struct SavedTensor {
  std::string module;  // the producer's module path
  std::uint64_t bytes = 0;
  std::size_t created = 0;
  std::size_t last_forward_use = 0;
  std::size_t first_backward_use = 0;
  std::size_t last_backward_use = 0;
  double recompute_ms = 0;
  bool recomputable = true;  // false for what cannot be made again (inputs, random ops' outputs)
  bool offloadable = true;
  std::vector<std::size_t> recompute_inputs;
  std::int32_t region = kNoRegion;
  std::vector<SaveSite> packs;  // sorted
};

// A module a plan may run under selective checkpointing, one call of it.
struct TraceRegion {
  std::string module;
  std::int64_t call = 0;
  bool checkpointable = true;
  std::vector<std::string> ops;       // its ops' names, as the checkpoint's policy sees them
  std::vector<std::size_t> inputs;    // the saved tensors it receives, per tensor argument
};

struct LifetimeTrace {
  std::vector<TraceOp> ops;
  std::vector<SavedTensor> tensors;
  std::vector<TraceRegion> regions;
  std::vector<SaveSite> kept_saves;
  CostModel cost;
  std::uint64_t unconstrained_peak_bytes = 0;

  // Throws LogicError naming the first broken rule of Note [Lifetime trace].
  void validate() const;
  double compute_ms() const;         // the ops' durations summed: the step with nothing changed
  std::size_t region_count() const;  // one past the highest region index
};

}  // namespace stowage::planner
