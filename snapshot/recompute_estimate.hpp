// The peak a recorded trace would have with each of the model's blocks checkpointed (recomputed
// in backward): the advice's saving for activations, where stowage's tags name the module that
// made each allocation (stowage.recompute_estimate finds the blocks and says the rule in words).
//
// Each run of a block (its consecutive allocations, one per forward) is handled apart: its
// forward keeps only what it returns (its last allocation still live when the run ends); the
// saved activations it made (those freed after the run, in backward) come back when its
// backward begins (just before the first of them is freed) and go at their own frees; at that
// moment the re-run forward also holds, for an instant, the rest of its own peak above what it
// brings back. Positions are LivePairs' (snapshot/peak_estimates.hpp); `own[p]` position p's
// change of the live bytes, `activations` the saved activations' positions, `block[p]` the block
// of each position (-1: none). Pure; bad arguments raise LogicError.
#pragma once

#include <cstdint>
#include <span>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

Wide checkpointed_peak(const LiveSeries& live, std::span<const std::uint8_t> is_alloc,
                       std::span<const std::int64_t> end, std::span<const std::int64_t> size,
                       std::span<const std::int64_t> own, std::span<const std::int64_t> activations,
                       std::span<const std::int64_t> block);

}  // namespace stowage::snapshot
