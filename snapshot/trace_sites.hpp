// A trace's allocations paired with the frees that end them (LivePairs, live_pairs.hpp's, owned),
// and the site each was made at (TraceSites: frame_sites.hpp's names, as small integers): what
// the inspector's findings read a trace through.
//
// Contract: pure functions; the results own their data.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "snapshot/frame_sites.hpp"

namespace stowage::snapshot {

struct LivePairs {
  std::vector<std::int64_t> index;  // the positions' event indexes in the trace
  std::vector<std::uint8_t> is_alloc;
  std::vector<std::int64_t> size, own, unknown, alloc_of, end;  // as LivePairsOut's
};

LivePairs pair_trace(std::span<const std::uint8_t> action, std::span<const std::uint64_t> addr,
                     std::span<const std::uint64_t> size);

// `of[p]`: the site of the allocation at position p (-1 at frees), an index into `names`;
// `first[s]`: the position of site s's first allocation. Sites named by a stack are numbered in
// the order of their stacks' indexes, then size classes, smallest first.
struct TraceSites {
  std::vector<std::string> names;
  std::vector<std::int64_t> of, first;
};

// `stack`: the trace's stack column (an index into `stacks`, or negative: no frames); `size` the
// trace's size column.
TraceSites name_sites(std::span<const std::int32_t> stack, std::span<const std::vector<Frame>> stacks,
                      std::span<const std::uint64_t> size, const LivePairs& pairs);

}  // namespace stowage::snapshot
