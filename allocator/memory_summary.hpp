// memory_summary: the statistics as a table in torch.cuda.memory_summary()'s layout.
//
// Input is the flattened statistics (memory_stats_entries, torch's key names: every
// "<metric>.<all|large_pool|small_pool>.<current|peak|allocated|freed>" of the nine metrics
// torch's table shows, "oversize_allocations.*", "oversize_segments.*", "num_ooms" and
// "num_alloc_retries"); output is the same text torch prints for its own allocator (a 75-column
// box), with `title` centred on top and `extra_lines` (the offload engine's figures) boxed below.
// Sizes are shown in the unit that keeps the row's largest figure under 768 of it, counts under
// 750 thousand, as torch does.
//
// Contract: a pure function; throws LogicError naming a missing key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace stowage {

std::string memory_summary(const std::map<std::string, std::int64_t>& stats, const std::string& title,
                           bool abbreviated, const std::vector<std::string>& extra_lines);

// The title stowage.memory_summary() gives the table of a device: CUDA device `device` of
// `capacity` bytes, or CPU mode's simulated device (`device` -1).
std::string memory_summary_title(std::int64_t device, std::size_t capacity);

}  // namespace stowage
