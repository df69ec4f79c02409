#include "allocator/history.hpp"

#include <chrono>
#include <new>
#include <utility>

#include "base/errors.hpp"

namespace stowage {

std::string_view trace_action_name(TraceAction action) noexcept {
  switch (action) {
    case TraceAction::kAlloc: return "alloc";
    case TraceAction::kFreeRequested: return "free_requested";
    case TraceAction::kFreeCompleted: return "free_completed";
    case TraceAction::kSegmentAlloc: return "segment_alloc";
    case TraceAction::kSegmentFree: return "segment_free";
    case TraceAction::kSegmentMap: return "segment_map";
    case TraceAction::kSegmentUnmap: return "segment_unmap";
    case TraceAction::kSnapshot: return "snapshot";
    case TraceAction::kOom: return "oom";
    case TraceAction::kMarkStep: return "snapshot";
    case TraceAction::kFitTrialBegin: return "snapshot";
    case TraceAction::kFitTrialEnd: return "snapshot";
  }
  return "unknown";
}

std::string_view marker_metadata(TraceAction action) noexcept {
  switch (action) {
    case TraceAction::kMarkStep: return kMarkStepMetadata;
    case TraceAction::kFitTrialBegin: return kFitTrialBeginMetadata;
    case TraceAction::kFitTrialEnd: return kFitTrialEndMetadata;
    default: return {};
  }
}

void History::enable(std::size_t max_entries) {
  STOWAGE_CHECK(max_entries > 0, "history needs room for at least one event");
  if (max_entries != max_entries_) {
    std::vector<TraceEntry> kept = entries();
    if (kept.size() > max_entries) {
      kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(max_entries));
    }
    ring_ = std::move(kept);
    next_ = 0;
    max_entries_ = max_entries;
  }
  enabled_ = true;
}

void History::disable() {
  enabled_ = false;
  ring_.clear();
  ring_.shrink_to_fit();
  next_ = 0;
  recorded_ = 0;
}

void History::record(const TraceEntry& entry) noexcept {
  if (!enabled_) return;
  if (ring_.size() < max_entries_) {
    try {
      ring_.push_back(entry);
      ++recorded_;
      return;
    } catch (const std::bad_alloc&) {
      if (ring_.empty()) return;  // not even one event fits: nothing is kept
      max_entries_ = ring_.size();  // memory is the bound from now on
    }
  }
  ring_[next_] = entry;
  next_ = (next_ + 1) % ring_.size();
  ++recorded_;
}

std::vector<TraceEntry> History::entries() const {
  std::vector<TraceEntry> out;
  out.reserve(ring_.size());
  out.insert(out.end(), ring_.begin() + static_cast<std::ptrdiff_t>(next_), ring_.end());
  out.insert(out.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

std::int64_t History::now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace stowage
