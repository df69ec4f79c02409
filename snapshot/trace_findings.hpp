// What one device's trace says (`stowage inspect`'s findings over its events): the live-bytes
// peak and what was live there, by site, by what it is (categories.hpp, or stowage's tags) and by
// module; stowage.fit's own trial steps' peak apart; the out-of-memory events; the steps
// (trace_steps.hpp) and the sites that grew over them (live_groups.hpp); and the advice
// (advice.hpp).
//
// Live bytes at an event = the trace's own allocations still live (each at the size it was
// allocated with; pairs as live_pairs.hpp makes them) + what was live before the trace began
// and is not yet freed. The latter starts at a baseline and drops with every free of an address
// the trace never allocated (a ring buffer that dropped its oldest events). The baseline comes
// from the snapshot's end (requested bytes of the live blocks, minus the trace's own still live,
// plus those unknown frees) where segments are known, else it is the unknown frees alone: never
// negative, and never less than what was freed of it. The headline peak is the first highest
// outside fit's trial steps. Byte counts are summed in 128 bits (Note [Live bytes in 128 bits]);
// the series is compared with floats as Python's integers where its sizes could pass int64.
//
// Contract: a pure function of its inputs; bad inputs raise LogicError naming them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "snapshot/advice.hpp"
#include "snapshot/frame_sites.hpp"
#include "snapshot/live_series.hpp"
#include "snapshot/segment_findings.hpp"
#include "snapshot/timelines.hpp"
#include "snapshot/trace_steps.hpp"

namespace stowage::snapshot {

inline constexpr std::size_t kMaxOoms = 50;           // OOM events explained; the rest are counted
inline constexpr std::size_t kMinGrowingSteps = 3;    // steps a site must grow over to be called growing
inline constexpr std::size_t kGrowthWindow = 8;       // the last steps of the run judged for growth
inline constexpr const char* kBeforeTrace = "(live before the trace began)";

// One device's trace as columns (TraceColumns), each stack's frames read once.
struct TraceInput {
  std::span<const std::uint8_t> action;
  std::span<const std::uint64_t> addr, size;
  std::span<const std::int32_t> stack;      // by event: an index into `stacks`, or kNoStack / kFramesNone
  std::span<const std::vector<Frame>> stacks;
  StepMarks marks;
  std::map<std::int64_t, Wide> device_free;  // the events that carry device_free, by index
};

// The categories and module paths stowage noted while recording (stowage's tags), by event.
struct ExactTags {
  std::vector<std::int64_t> events;    // allocation events (indexes into the trace)
  std::vector<std::int8_t> category;   // kCategoryNames' numbering (what no hook saw: temporaries)
  std::vector<std::int64_t> module;    // an index into `paths` (0: outside any module's forward)
  std::vector<std::string> paths;
  std::vector<std::int64_t> block_of_path;  // each path's block (recompute_estimate.hpp), -1: none
  std::vector<std::string> blocks;
};

struct TraceOptions {
  std::optional<Wide> requested_at_end;  // the live blocks' requested bytes, where segments are known
  std::size_t top = 10;                  // sites (and modules, and growing sites) listed
  Wide cached_free = 0;                  // the cache's free bytes at the snapshot (for an OOM's advice)
  bool under_stowage = false;            // stowage's allocator recorded the snapshot
  std::optional<ExactTags> tags;
  bool timelines = false;                // draw the HTML report's timelines (timelines.hpp)
  std::vector<std::int64_t> moments;     // events to say what was live just after, and what it was
};

struct ModuleLive {
  std::string module;  // "": outside any module's forward
  Wide bytes = 0;
};

struct Peak {
  Wide live_bytes = 0;
  std::int64_t event_index = -1;  // -1: before any event
  Wide baseline = 0;              // bytes live before the trace's first event, as far as the end tells
  std::vector<SiteLive> sites;
  std::vector<std::pair<std::string, Wide>> categories;  // the trace's own live bytes, by category
  std::vector<ModuleLive> modules;                        // where stowage's tags name them
};

struct OomFinding {
  std::int64_t event_index = 0;
  Wide requested = 0, device_free = 0, live_bytes = 0;
  std::vector<SiteLive> sites;
  bool in_fit_trial = false;  // in one of stowage.fit's own trial steps, not the run's
  bool under_stowage = false;
};

// The allocations live just after an event, and what each is (the peak's categories' way).
struct LiveMoment {
  std::int64_t event_index = 0;
  std::vector<std::int64_t> events;     // their allocation events
  std::vector<std::int8_t> categories;  // kCategoryNames' numbering
};

struct TraceFindings {
  Peak peak;
  std::optional<Peak> fit_trial_peak;
  std::vector<OomFinding> ooms;  // at most kMaxOoms
  std::int64_t oom_events = 0;
  Steps steps;
  std::vector<GrowingSite> growing;
  std::vector<Advice> advice;
  bool exact_categories = false;  // the peak's categories are stowage's tags, not inferred
  std::optional<Timelines> timelines;
  std::vector<LiveMoment> moments;  // TraceOptions::moments', in order
};

TraceFindings analyse_trace(const TraceInput& trace, const TraceOptions& options);

}  // namespace stowage::snapshot
