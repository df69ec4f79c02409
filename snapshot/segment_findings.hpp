// What a snapshot's segments say about one device at its end (`stowage inspect`'s totals, its
// segment summary and its sites at the end):
// - totals: allocated, active, requested, reserved, reserved but unallocated, the largest free
//   block, and fragmentation = 1 - largest free block / free reserved bytes (reserved minus
//   active; 0 when nothing is free): the share of free cached memory a single request could not
//   use;
// - segments by size bucket, how full they are (quartiles of live / total), and those held by
//   one small live block (less than kSmallSegment of the segment: a segment that cannot go back
//   to the device for a few bytes; never an expandable one, whose free pages can be unmapped);
// - live bytes by allocation site (frame_sites.hpp; classified by the size asked for).
//
// Byte counts are summed in 128 bits (Note [Live bytes in 128 bits]). Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

inline constexpr double kSmallSegment = 0.25;

// A block of a segment as the snapshot holds it.
struct BlockFacts {
  Wide size = 0, requested = 0;          // requested: requested_size, else size
  std::string state;                     // "active_allocated", "active_pending_free", "inactive", ...
  std::optional<std::string> frame_site;  // frame_sites.hpp's, of its frames
};

struct SegmentInput {
  Wide address = 0, total = 0;
  bool expandable = false;
  std::vector<BlockFacts> blocks;
};

struct Totals {
  Wide allocated = 0, active = 0, requested = 0, reserved = 0, reserved_unallocated = 0, largest_free_block = 0;
  double fragmentation = 0.0;
  std::int64_t segments = 0;
};

struct SizeBucket {
  std::string size;  // "<= 2 MiB" and so on
  std::int64_t count = 0;
  Wide bytes = 0;
};

struct HeldSegment {
  Wide address = 0, segment_bytes = 0, live_bytes = 0, held_back = 0;
  std::string site;
};

struct SegmentSummary {
  std::int64_t count = 0;
  std::vector<SizeBucket> by_size;     // the buckets with segments, smallest first
  std::vector<double> fill_quartiles;  // live / total at 25%, 50%, 75%; empty without segments
  std::vector<HeldSegment> held_by_one_small_block;  // most held back first, at most `top`
};

// Live bytes and allocations at one site.
struct SiteLive {
  std::string site;
  Wide bytes = 0;
  std::int64_t allocations = 0;
};

// The block's site where its allocation asked for `size` bytes.
std::string site_of(const BlockFacts& block, Wide size);

Totals totals_of(const std::vector<SegmentInput>& segments);
SegmentSummary summary_of(const std::vector<SegmentInput>& segments, std::size_t top);
// The `top` sites by live bytes of the allocated blocks, most first (ties in the order met).
std::vector<SiteLive> sites_at_end(const std::vector<SegmentInput>& segments, std::size_t top);

}  // namespace stowage::snapshot
