// Advice the inspector gives (stowage inspect): each rule names a waste it sees in the trace,
// the bytes the peak would lose without it, and the call that removes it.
//
// The saving is computed from the trace, not guessed: the live-bytes series is re-simulated
// without the allocations the advice would remove (every one of the waste's, over the whole
// trace, from its allocation to its free: moving the optimizer to the host takes its states and
// its update's temporaries; offloading activations takes every step's) and the new peak taken
// (snapshot/peak_estimates.hpp); the saving is the old peak less the new.
//
// Rules (each fires only where its waste is at least kMinShare of the peak):
// - optimizer states at the peak -> stowage.offload.AdamW (states in host memory) or stowage.fit;
// - activations at the peak -> checkpointing each block, offload, or a plan (stowage.plan /
//   stowage.fit). Where the snapshot names the module that made each allocation (stowage's own,
//   tagged), the saving is the trace re-simulated with each block checkpointed
//   (snapshot/recompute_estimate.hpp); elsewhere the saving of removing them all, an upper bound;
// - tensors made in a forward that outlive it with no backward (a graph kept: evaluation without
//   torch.no_grad()) -> torch.no_grad() / torch.inference_mode() around it;
// - gradients at the peak made in an earlier step (kept across steps: zero_grad(set_to_none=False),
//   or none) -> optimizer.zero_grad(set_to_none=True) after each step (peak_estimates.hpp says
//   how the step then runs);
// - memory that grows at every step -> the site that keeps it (a loss kept with its graph: .item()
//   or .detach()); the saving: the trace without that site's allocations that outlive their step;
// - an out-of-memory with enough bytes free but no block whole (reserved but unallocated) ->
//   stowage's allocator, with the replay's peak reserved where the inspector has it; never for a
//   snapshot stowage's allocator recorded (no advice to use what the run already uses);
// - inputs at the peak -> a smaller batch or micro-batches (stowage.fit(..., micro_batches="auto"));
// - logit-sized tensors at the peak (sizes the loss function itself allocates) -> a chunked loss:
//   the sizes of the loss's own large allocations (at least a hundredth of the peak: its
//   log-softmax, an upcast or shifted copy of the logits; half of one: logits in 16 bits), live
//   at the peak outside parameters, gradients and states. A chunked loss holds one chunk of each
//   at a time: the saving is the trace re-simulated with every such allocation kLossChunks times
//   smaller. (A loss already chunked is advised again while one chunk's logits are still a tenth
//   of the peak: more chunks save more.)
//
// A waste is "at least kMinShare of the peak" as Python compares an integer with a float: exactly,
// against the float kMinShare * peak. Byte counts are summed in 128 bits (Note [Live bytes in 128
// bits]); one past 2**64 cannot be written as bytes and raises LogicError.
//
// Contract: a pure function of the inspector's findings and the trace's evidence; the advice is
// returned largest saving first (ties in the order the rules are listed above, as found), and
// only where the saving is positive.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "snapshot/advice_evidence.hpp"
#include "snapshot/categories.hpp"
#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

inline constexpr double kMinShare = 0.10;
inline constexpr std::int64_t kLossChunks = 8;  // the chunks a chunked loss is advised in

// The headline peak as the inspector found it.
struct AdvicePeak {
  Wide live_bytes = 0;
  std::int64_t position = -1;                  // LivePairs position; -1: before any event
  Positions live_at;                           // the allocations live just after it
  std::span<const std::int8_t> category_at;    // ... and their categories
  std::array<Wide, std::size(kCategoryNames)> by_category{};  // the report's bytes by category there
  std::string first_block;                     // the first block's module path, where there are blocks
};

// A site whose live bytes grew at every step's end (stowage.trace_steps.growing).
struct GrowingSite {
  std::int64_t site = -1;  // its id in AdviceTrace::site; -1: none there
  std::string name;
  Wide bytes_per_step = 0;
  std::int64_t steps = 0;
};

// The run's first out-of-memory event (not one of stowage.fit's trials).
struct OomFacts {
  Wide requested = 0, device_free = 0, cached_free = 0;
  std::optional<Wide> replayed_reserved;  // stowage's replay's peak reserved, where known
  bool under_stowage = false;             // stowage's allocator recorded the snapshot
};

struct Advice {
  std::string rule;
  Wide waste = 0, saving = 0;
  std::optional<bool> upper_bound;  // set for the rules whose saving may be a bound
  std::string text;
};

std::vector<Advice> advise(AdviceEvidence& evidence, const AdvicePeak& peak, std::span<const GrowingSite> growing,
                           const std::optional<OomFacts>& oom);

}  // namespace stowage::snapshot
