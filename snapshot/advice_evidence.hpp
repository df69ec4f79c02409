// What the inspector's advice rules (snapshot/advice.hpp) read of a trace, gathered from its
// columns: the parts a rule may not need are worked out only when it asks, and once however many
// rules ask.
//
// Positions are LivePairs' (snapshot/live_pairs.hpp): n of them; `end[p]` the free that ends the
// allocation at p (n: never freed), `step_starts` the positions where steps begin (empty: one
// step). `flags` are each position's stack flags as read off its frames (snapshot/categories.hpp);
// `marked` the same with autograd's thread's events marked backward's (mark_autograd_thread),
// read only where `frames` says the trace has Python frames to read. Where stowage tagged the
// snapshot, `exact_category` is each position's category as noted while recording (what no hook
// saw a temporary); else it is empty and categories are inferred.
//
// Contract: AdviceEvidence keeps a reference to the AdviceTrace, whose spans must outlive it; it
// copies none of them and changes nothing. Not thread-safe (its caches fill as rules ask).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "snapshot/categories.hpp"
#include "snapshot/live_series.hpp"
#include "snapshot/peak_estimates.hpp"

namespace stowage::snapshot {

struct AdviceTrace {
  LiveSeries live;                          // live bytes just after each position
  std::span<const std::uint8_t> is_alloc;
  Positions end;
  std::span<const std::int64_t> size, own;  // own: each position's change of the live bytes
  std::span<const std::int64_t> index;      // each position's event in the trace
  std::span<const std::int32_t> stack;      // the trace's stack column, by event
  std::span<const std::int8_t> flags, marked;
  bool frames = false;
  Positions step_starts;
  std::span<const std::int64_t> site;             // each position's allocation site (an id)
  std::span<const std::int8_t> exact_category;    // stowage's tags; empty: none
  std::span<const std::int64_t> block;            // each position's block (-1: none), where tags name modules
  std::size_t blocks = 0;                         // how many blocks there are
};

// Categories inferred for every allocation (int8, UNKNOWN at frees), a chunk of kCategoryChunk
// allocations at a time: with steps' starts out of order, the rules' step search depends on the
// positions searched before in the same chunk (NumpySearch), as the inspector's categories by position did.
inline constexpr std::size_t kCategoryChunk = std::size_t{1} << 20;
std::vector<std::int8_t> all_categories(const CategoryInputs& inputs);

class AdviceEvidence {
 public:
  explicit AdviceEvidence(const AdviceTrace& trace);

  const AdviceTrace& trace() const { return trace_; }
  std::size_t positions() const { return trace_.is_alloc.size(); }
  // Every position's category: the tags' where the snapshot has them, else inferred.
  const std::vector<std::int8_t>& every();
  // Whether each position was made under torch.optim (its own frames', autograd's not marked).
  bool made_by_optimizer(std::size_t p) const { return (trace_.flags[p] & kOptimizer) != 0; }
  // Backward's allocations (autograd's thread's on a GPU), in order; none without Python frames.
  const std::vector<std::int64_t>& backward_allocations();
  // The allocations a forward left with no backward (categories.hpp's kept_without_backward; with
  // tags, only those autograd saved: the activations).
  std::vector<std::int64_t> kept_without_backward() const;
  // A site's allocations kept into a later step, not for its backward (a step boundary found by
  // repetition may cut through a forward, whose activations backward frees in the next step).
  std::vector<std::int64_t> kept_across_steps(std::int64_t site);
  // The allocations a loss function made in forward (a function named for a loss, called inside
  // the innermost module's forward or outside any).
  std::vector<std::int64_t> loss_allocations() const;

 private:
  CategoryInputs inputs(bool with_steps) const;

  const AdviceTrace& trace_;
  std::optional<std::vector<std::int8_t>> every_;
  std::optional<std::vector<std::int64_t>> backward_;
};

}  // namespace stowage::snapshot
