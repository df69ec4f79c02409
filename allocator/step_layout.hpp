// Step layouts: offsets in one arena for the allocations of a repeating training step, packed
// from their recorded lifetimes (Note [Learned placement] in learned_placement.hpp).
//
// A step is a cycle of `period` ticks. An allocation lives from tick `start` up to tick `end`
// (exclusive); end <= start means it lives across the step boundary: from `start` to the end of
// the step, and in the next step from its beginning to `end`. Because every step repeats the
// same allocations, an allocation keeps its offset in every step, and two allocations conflict
// when their lifetimes overlap anywhere on the cycle. lay_out_step gives each allocation an
// offset such that conflicting allocations never overlap in address, in an arena as small as it
// can make it.
//
// Packing (dynamic storage allocation) is NP-hard; the heuristic is greedy by size: the
// largest allocations first (longer lifetimes first on ties), each placed in the smallest gap
// between the conflicting allocations already placed that holds it (lowest offset on ties), or
// on top of them. On training steps this lands close to the largest sum of bytes live at one
// tick, the lower bound (bench/results/2026-11-22-cpu-learned-placement.md; tests check both the
// absence of conflicts and the bound on random and recorded steps).
//
// Contract: a pure function. O(n^2) time in the number of allocations and O(n) memory; callers
// bound n (StepLearner lays out at most kMaxLaidOutAllocations).
#pragma once

#include <cstddef>
#include <vector>

namespace stowage {

struct Lifetime {
  std::size_t bytes = 0;
  std::size_t start = 0;  // tick of the allocation, < period
  std::size_t end = 0;    // tick of the free, <= period; <= start: freed in the next step
};

struct StepLayout {
  std::vector<std::size_t> offsets;  // one per lifetime, in input order
  std::size_t arena_bytes = 0;       // the highest offset + bytes
  std::size_t peak_live_bytes = 0;   // the most bytes live at one tick: no layout needs less
};

// Throws LogicError for a lifetime outside the cycle or of zero bytes, or a period of zero.
StepLayout lay_out_step(const std::vector<Lifetime>& lifetimes, std::size_t period);

// True when lifetimes a and b overlap on a cycle of `period` ticks.
bool lifetimes_overlap(const Lifetime& a, const Lifetime& b, std::size_t period) noexcept;

}  // namespace stowage
