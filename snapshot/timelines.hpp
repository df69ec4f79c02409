// The HTML report's timelines (stowage inspect --html): live bytes over a trace by group, sampled
// (live_groups.hpp's grouped_live: at most kMaxPoints samples, the peak and the last event always
// among them), and named:
// - by site: the kTimelineSites sites that held most at the headline peak, the rest "other";
// - by what each allocation is (stowage's tags, else inferred: categories.hpp);
// - by module, where stowage's tags name them: by block (recompute_estimate.hpp's blocks) and,
//   outside blocks, by module to three names deep ("(outside any module's forward)" for path 0);
//   the kTimelineSites that allocate most, the rest "other modules".
// Bytes live before the trace began (its baseline, less the unknown frees so far) are a series of
// their own where the baseline is not 0. The category and module timelines keep only the series
// with a byte in them.
//
// Contract: a pure function of the trace's findings; the result owns its data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "snapshot/live_series.hpp"
#include "snapshot/segment_findings.hpp"
#include "snapshot/trace_sites.hpp"

namespace stowage::snapshot {

inline constexpr std::size_t kMaxPoints = 1500;
inline constexpr std::size_t kTimelineSites = 8;

struct Timeline {
  std::vector<std::int64_t> x;  // the samples' event indexes
  std::vector<std::pair<std::string, std::vector<Wide>>> series;  // named, in the order drawn
  std::int64_t peak_index = -1;  // the event where the trace's own live bytes are highest; -1: no events
};

struct Timelines {
  Timeline by_site, by_category;
  std::optional<Timeline> by_module;  // where stowage's tags name modules
};

struct TimelineInputs {
  const LivePairs& pairs;
  const TraceSites& sites;
  Wide baseline = 0;
  std::span<const SiteLive> peak_sites;   // the headline peak's, most first
  std::span<const std::int8_t> category;  // every position's (tags', else inferred)
  // Where stowage's tags name modules: each position's path, the paths and each path's block.
  std::span<const std::int64_t> module;
  std::span<const std::string> paths;
  std::span<const std::int64_t> block_of_path;
  std::span<const std::string> blocks;
};

Timelines timelines_of(const TimelineInputs& inputs);

}  // namespace stowage::snapshot
