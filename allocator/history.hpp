// A bounded ring buffer of allocator events, in the vocabulary of PyTorch's snapshot traces.
//
// Events: mark_step (a training step ended), alloc and free_requested / free_completed carry the caller's unrounded size;
// segment_alloc / segment_free / segment_map / segment_unmap carry segment bytes; oom carries
// the request in `size` and the device's free bytes in `address` (as torch's trace does). Each
// event has the stream, a wall-clock time in microseconds since the epoch, and an opaque stack
// handle supplied by the caller (0: none), which the Python layer resolves into frames.
//
// When disabled, recording is one predictable branch in the caller (enabled() is checked before
// anything is built). The ring grows as events come, up to its bound (max_entries), and is never
// sized from the bound: torch's default bound is sys.maxsize, "keep everything", which only memory
// limits. Once the bound is reached (or memory runs out while growing, which then becomes the
// bound), the oldest event is overwritten.
//
// Contract: not thread-safe (the allocator's lock guards it). Owns its events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "device/backend.hpp"

namespace stowage {

enum class TraceAction : std::uint8_t {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kSnapshot,  // torch records it for snapshots taken in mid-trace; kept for its vocabulary
  kOom,
  // The end of a training step (CachingAllocator::mark_step). torch's snapshots have no such
  // action: it is written as a "snapshot" marker whose user_metadata is kMarkStepMetadata.
  kMarkStep,
  // Where stowage.fit's own trial steps (its recording of the step, its rate probes) begin and
  // end, so that a run's inspection can set them apart; written as "snapshot" markers too.
  kFitTrialBegin,
  kFitTrialEnd,
};

inline constexpr std::string_view kMarkStepMetadata = "stowage.mark_step";
inline constexpr std::string_view kFitTrialBeginMetadata = "stowage.fit.trial_begin";
inline constexpr std::string_view kFitTrialEndMetadata = "stowage.fit.trial_end";

// The user_metadata a marker action is written with ("" for the other actions).
std::string_view marker_metadata(TraceAction action) noexcept;

// "alloc", "free_requested", ...: the names torch's snapshots use (the markers: "snapshot").
std::string_view trace_action_name(TraceAction action) noexcept;

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  Stream stream;
  std::int64_t time_us = 0;
  std::uint64_t context = 0;
};

class History {
 public:
  static constexpr std::size_t kDefaultMaxEntries = 100000;

  bool enabled() const noexcept { return enabled_; }
  // Turning recording on keeps what was recorded; a smaller max_entries keeps the newest events.
  // Any bound from 1 up is taken (std::size_t's largest included); 0 is a LogicError.
  void enable(std::size_t max_entries);
  // Stops recording and drops every event.
  void disable();
  // Never throws: an event that finds no memory to grow into overwrites the oldest instead.
  void record(const TraceEntry& entry) noexcept;
  // The events, oldest first.
  std::vector<TraceEntry> entries() const;
  // Events recorded since recording was turned on, the overwritten ones included: the event
  // entries()[i] was the (recorded() - entries().size() + i)-th. Python notes it beside what it
  // tags (stowage.tagging) to find the event a tag is about.
  std::uint64_t recorded() const noexcept { return recorded_; }

  static std::int64_t now_us() noexcept;

 private:
  bool enabled_ = false;
  std::size_t max_entries_ = kDefaultMaxEntries;
  // The events; while ring_.size() < max_entries_ they are in order and the next one is appended,
  // afterwards the oldest is at next_ and the next event overwrites it.
  std::vector<TraceEntry> ring_;
  std::size_t next_ = 0;
  std::uint64_t recorded_ = 0;
};

}  // namespace stowage
