// From a recorded step to its lifetime trace (Note [Building a trace]).
//
// Note [Building a trace]
// A recording lists the step's ops (with the memory in use during each, relative to the step's
// start) and every storage autograd saved: its bytes, the op that made it (none for one made
// before the step), its last forward use, its first and last backward use, and the ops and
// regions of its saves. The trace keeps what the runtime can apply:
// - a storage made before the step (a batch, a parameter), or never taken back by backward, is
//   not in the trace: no decision frees it (`left_out`);
// - saved storages are grouped by the op that made them (selective checkpointing saves or
//   recomputes per op, so one op's outputs share a decision), in the order of those ops;
// - a tensor is in region r when its op ran in block r and some save of it happened there; it can
//   be recomputed when every save of it happened in r and r can be checkpointed; a block can be
//   checkpointed when the recording allows it, it ran once, and each tensor it receives is saved
//   within it (so running it under a checkpoint, which keeps its inputs, adds nothing); a tensor
//   of a block that cannot be is of no region (its saves reach the offloader);
// - recomputing a region reruns its ops up to its last saved tensor's (recompute times:
//   planner/derived_quantities.hpp, over the regions as recorded), and needs the region's inputs
//   recorded before the tensor back first;
// - each op's memory besides the saved tensors follows from the memory in use during it, and the
//   step's unconstrained peak from the trace (planner/derived_quantities.hpp);
// - a tensor's packs are its storages' save sites; the saves of storages left out, and of fixed
//   ones, are the trace's kept saves; each region lists its ops as they ran (region_op).
//
// Contract: a free function over a recording it only reads; throws LogicError naming a recording
// whose indices point outside it, or a trace that breaks Note [Lifetime trace].
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/lifetime_trace.hpp"

namespace stowage::planner {

struct RecordedStorage {
  std::uint64_t bytes = 0;
  std::optional<std::size_t> producer;        // none: made before the step
  std::optional<std::size_t> last_forward;    // none: its producer's op
  std::optional<std::size_t> first_backward;  // none: backward never took it back
  std::optional<std::size_t> last_backward;   // none: its first backward use
  std::vector<std::int64_t> save_ops;         // the op before each save (-1: before the step's first)
  std::vector<std::int32_t> save_regions;     // the region of each save (kNoRegion: none)
  std::vector<SaveSite> sites;                // where each save happened, where it was in a module
};

struct RecordedRegion {
  std::string module;
  bool checkpointable = true;  // as recorded: false for a block that writes its input, or cannot replay
  std::vector<std::int64_t> inputs;  // the storages it receives (indices; -1: no saved storage)
  std::int64_t call = 0;             // the module's call number in the step
};

struct StepRecording {
  std::vector<TraceOp> ops;  // with in_use_bytes and region; other_bytes is derived
  std::vector<RecordedStorage> storages;
  std::vector<RecordedRegion> regions;
  std::vector<SaveSite> fixed_saves;  // saves of storages no decision reaches (parameters, buffers)
};

struct BuiltTrace {
  LifetimeTrace trace;
  std::vector<std::vector<std::size_t>> storages_of_tensor;  // the storages each tensor groups
  std::vector<std::size_t> left_out;                         // storages not in the trace
  std::vector<bool> region_checkpointable;
  std::vector<std::vector<std::size_t>> region_inputs;  // per region, the tensors it receives, in order
  std::uint64_t unconstrained_peak_bytes = 0;
};

BuiltTrace build_trace(const StepRecording& recording);

}  // namespace stowage::planner
