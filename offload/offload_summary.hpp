// offload_summary_lines: the offload engine's statistics (stowage.memory_stats()' "offload.*"
// keys) as the lines stowage.memory_summary() and stowage inspect show below their tables: the
// bytes offloaded now and at most, the pinned host memory, the copies' volume and rate, the
// stalls, prefetches and syncs.
//
// Contract: a pure function; no lines before anything was offloaded ("offload.num_offloads"
// absent or 0); throws LogicError naming a key that is missing or a byte count that is negative.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace stowage::offload {

std::vector<std::string> offload_summary_lines(const std::map<std::string, std::int64_t>& stats);

}  // namespace stowage::offload
