#include "allocator/step_learner.hpp"

#include <algorithm>

#include "allocator/step_layout.hpp"
#include "base/errors.hpp"

namespace stowage {

namespace {

// z[i]: the length of the longest common prefix of s and s[i:] (z[0] = s.size()); O(n).
void z_function(const std::vector<std::uint64_t>& s, std::vector<std::size_t>& z) {
  const std::size_t n = s.size();
  z.assign(n, 0);
  if (n == 0) return;
  z[0] = n;
  std::size_t left = 0;
  std::size_t right = 0;  // [left, right): the rightmost match found so far
  for (std::size_t i = 1; i < n; ++i) {
    if (i < right) z[i] = std::min(right - i, z[i - left]);
    while (i + z[i] < n && s[z[i]] == s[i + z[i]]) ++z[i];
    if (i + z[i] > right) {
      left = i;
      right = i + z[i];
    }
  }
}

}  // namespace

std::uint64_t StepLearner::record_malloc(std::size_t bytes) {
  if (phase_ != Phase::kLearning) return kNoRecord;
  if (ready_) {
    // A layout not taken yet: the program has moved one allocation further through it.
    ready_->next = (ready_->next + 1) % ready_->allocations.size();
    return kNoRecord;
  }
  if (symbols_.size() >= kMaxEvents) trim();
  const std::uint64_t id = next_record_++;
  records_.push_back({bytes, event_base_ + symbols_.size(), kNotFreed});
  live_bytes_ += static_cast<std::int64_t>(bytes);
  push_event(static_cast<std::uint64_t>(bytes) << 1, id);
  // Looked for after allocations only: a layout found here is taken before the next one.
  if (!ready_ && !marked_) maybe_detect();
  return id;
}

void StepLearner::record_free(std::uint64_t record) {
  if (phase_ != Phase::kLearning || record < record_base_ || record >= next_record_) return;
  if (symbols_.size() >= kMaxEvents) {
    trim();
    if (record < record_base_) return;
  }
  Record& freed = records_[record - record_base_];
  if (freed.free_event != kNotFreed) return;
  freed.free_event = event_base_ + symbols_.size();
  live_bytes_ -= static_cast<std::int64_t>(freed.bytes);
  push_event(((next_record_ - record) << 1) | 1, kNoRecord);
}

void StepLearner::push_event(std::uint64_t symbol, std::uint64_t record) {
  symbols_.push_back(symbol);
  live_.push_back(live_bytes_);
  event_record_.push_back(record);
}

std::optional<StepLearner::Layout> StepLearner::take_layout() {
  if (!ready_) return std::nullopt;
  std::optional<Layout> layout = std::move(ready_);
  ready_.reset();
  layout_ = *layout;
  cursor_ = layout_.next;
  waiting_ = cursor_ != 0;
  phase_ = Phase::kPlaced;
  ++layouts_made_;
  clear_events();
  return layout;
}

bool StepLearner::mark_step() {
  marked_ = true;
  if (phase_ == Phase::kPlaced) {
    if (cursor_ == 0) return false;
    depart();
    return true;
  }
  if (phase_ != Phase::kLearning || ready_) return false;
  marks_.push_back(event_base_ + symbols_.size());
  if (marks_.size() > 3) marks_.erase(marks_.begin());
  if (marks_.size() < 3 || marks_[0] < event_base_) return false;
  const std::size_t period = marks_[2] - marks_[1];
  if (period == 0 || marks_[1] - marks_[0] != period) return false;
  // (Marks are the program's word: a step departed from may be learned again, but one with
  // nothing to lay out is not built again and again.)
  if (!contains(periods_without_layout_, period) && repeats(period)) {
    build_layout(period, /*from_fewest_live=*/false);
  }
  return false;
}

const StepLearner::LayoutEntry* StepLearner::peek_entry(std::size_t bytes) {
  STOWAGE_INTERNAL_ASSERT(phase_ == Phase::kPlaced, "peek_entry without a layout");
  const LayoutEntry& next = layout_.allocations[cursor_];
  if (next.bytes != bytes) {
    depart();
    return nullptr;
  }
  if (waiting_) {
    waiting_entry_ = {bytes, kDynamic};
    return &waiting_entry_;
  }
  return &next;
}

void StepLearner::commit_entry() {
  STOWAGE_INTERNAL_ASSERT(phase_ == Phase::kPlaced, "commit_entry without a layout");
  cursor_ = cursor_ + 1 == layout_.allocations.size() ? 0 : cursor_ + 1;
  if (waiting_) waiting_ = cursor_ != 0;
}

const StepLearner::LayoutEntry* StepLearner::next_entry(std::size_t bytes) {
  const LayoutEntry* next = peek_entry(bytes);
  if (next != nullptr) commit_entry();
  return next;
}

void StepLearner::depart() {
  ++departures_;
  if (layout_.period_events != 0) remember(rejected_periods_, layout_.period_events);
  layout_ = Layout{};
  ready_.reset();
  cursor_ = 0;
  waiting_ = false;
  clear_events();
  phase_ = departures_ >= kMaxDepartures ? Phase::kOff : Phase::kLearning;
}

bool StepLearner::contains(const std::vector<std::size_t>& periods, std::size_t period) {
  return std::find(periods.begin(), periods.end(), period) != periods.end();
}

void StepLearner::remember(std::vector<std::size_t>& periods, std::size_t period) {
  if (contains(periods, period)) return;
  // Bounded: the oldest is forgotten first.
  if (periods.size() >= kMaxRejectedPeriods) periods.erase(periods.begin());
  periods.push_back(period);
}

void StepLearner::reset() {
  layout_ = Layout{};
  ready_.reset();
  cursor_ = 0;
  waiting_ = false;
  clear_events();
  if (phase_ != Phase::kOff) phase_ = Phase::kLearning;
}

void StepLearner::clear_events() {
  event_base_ += symbols_.size();
  symbols_.clear();
  live_.clear();
  event_record_.clear();
  records_.clear();
  record_base_ = next_record_;  // frees of earlier allocations are not events any more
  live_bytes_ = 0;
  marks_.clear();
  next_check_ = 0;
}

void StepLearner::trim() {
  const std::size_t drop = symbols_.size() / 2;
  const auto cut = static_cast<std::ptrdiff_t>(drop);
  symbols_.erase(symbols_.begin(), symbols_.begin() + cut);
  live_.erase(live_.begin(), live_.begin() + cut);
  event_record_.erase(event_record_.begin(), event_record_.begin() + cut);
  event_base_ += drop;
  const auto first_kept = std::find_if(records_.begin(), records_.end(), [&](const Record& r) {
    return r.event >= event_base_;
  });
  record_base_ += static_cast<std::uint64_t>(first_kept - records_.begin());
  records_.erase(records_.begin(), first_kept);
  next_check_ = next_check_ > drop ? next_check_ - drop : 0;
}

void StepLearner::maybe_detect() {
  const std::size_t n = symbols_.size();
  if (n < next_check_ || n < 2 * kMinPeriodEvents) return;
  next_check_ = n + std::max<std::size_t>(256, n / 4);
  if (const std::size_t period = detect_period(); period != 0) {
    build_layout(period, /*from_fewest_live=*/true);
  }
}

bool StepLearner::repeats(std::size_t period) const {
  const std::size_t n = symbols_.size();
  if (period == 0 || 2 * period > n) return false;
  if (live_[n - 1] != live_[n - 1 - period]) return false;
  return std::equal(symbols_.end() - static_cast<std::ptrdiff_t>(period), symbols_.end(),
                    symbols_.end() - static_cast<std::ptrdiff_t>(2 * period));
}

std::size_t StepLearner::detect_period() {
  const std::size_t n = symbols_.size();
  reversed_.assign(symbols_.rbegin(), symbols_.rend());
  z_function(reversed_, z_);
  const std::vector<std::size_t>& z = z_;
  // A step climbs at least halfway from the fewest bytes live to the most; a loop inside one
  // (an optimizer's loop over layers of one shape) repeats far below that.
  const auto [lowest_at, highest_at] = std::minmax_element(live_.begin(), live_.end());
  const std::int64_t lowest = *lowest_at;
  const std::int64_t highest = *highest_at;
  highest_since_.resize(n);  // the most live from event i to the end
  std::int64_t running = INT64_MIN;
  for (std::size_t i = n; i-- > 0;) highest_since_[i] = running = std::max(running, live_[i]);
  const std::vector<std::int64_t>& highest_since = highest_since_;
  allocations_since_.resize(n + 1);  // allocation events from event i to the end
  allocations_since_[n] = 0;
  for (std::size_t i = n; i-- > 0;) {
    allocations_since_[i] = allocations_since_[i + 1] + (event_record_[i] != kNoRecord ? 1 : 0);
  }
  // A repeat of `period` events that could be a step, whatever its size.
  auto repeats_as_step = [&](std::size_t period) {
    return 2 * period <= n && z[period] >= period && live_[n - 1] == live_[n - 1 - period] &&
           2 * (highest_since[n - period] - lowest) >= highest - lowest;
  };
  auto rejected = [&](std::size_t period) {
    return contains(rejected_periods_, period) || contains(periods_without_layout_, period);
  };
  std::size_t longest = 0;
  for (std::size_t period = n / 2; period >= 1; --period) {
    if (repeats_as_step(period) && !rejected(period)) {
      longest = period;
      break;
    }
  }
  if (longest == 0) return 0;
  // Several steps may repeat as one: the shortest period that divides the longest. When that
  // is a short loop, repeated, there is no step to lay out.
  std::size_t shortest = longest;
  for (std::size_t parts = longest; parts > 1; --parts) {
    if (longest % parts == 0 && repeats_as_step(longest / parts)) {
      shortest = longest / parts;
      break;
    }
  }
  if (shortest < kMinPeriodEvents || allocations_since_[n - shortest] < kMinFoundAllocations ||
      rejected(shortest)) {
    return 0;
  }
  return shortest;
}

void StepLearner::build_layout(std::size_t period, bool from_fewest_live) {
  const std::size_t n = symbols_.size();
  const std::size_t window = n - period;  // relative index of the window's first event
  // The step starts `shift` events into the window: after its fewest-live event (the first of
  // them), or at once for a marked step.
  std::size_t shift = 0;
  if (from_fewest_live) {
    const auto fewest = std::min_element(live_.begin() + static_cast<std::ptrdiff_t>(window),
                                         live_.end());
    shift = (static_cast<std::size_t>(fewest - live_.begin()) + 1 - window) % period;
  }
  auto tick = [&](std::size_t event) {  // event: relative index in [window, window + period]
    return (event - window + period - shift) % period;
  };
  Layout layout;
  layout.period_events = period;
  std::vector<Lifetime> lifetimes;
  std::vector<std::size_t> laid_out;  // index into window_allocations of each lifetime
  std::vector<LayoutEntry> window_allocations;
  std::size_t before_start = 0;  // window allocations made before the step's start
  for (std::size_t i = window; i < n; ++i) {
    const std::uint64_t id = event_record_[i];
    if (id == kNoRecord) continue;
    if (i - window < shift) ++before_start;
    const Record& record = records_[id - record_base_];
    std::size_t freed = kNotFreed;  // relative event of the free
    if (record.free_event != kNotFreed) {
      freed = record.free_event - event_base_;
    } else if (const std::uint64_t previous = event_record_[i - period]; previous != kNoRecord) {
      // Still live at the window's end: it is freed where the previous step's same allocation
      // was freed in this window, if that came before this one was made.
      const std::size_t earlier = records_[previous - record_base_].free_event;
      if (earlier != kNotFreed && earlier - event_base_ >= window && earlier - event_base_ < i) {
        freed = earlier - event_base_;
      }
    }
    if (freed != kNotFreed) {
      lifetimes.push_back({record.bytes, tick(i), tick(freed)});
      laid_out.push_back(window_allocations.size());
    }
    window_allocations.push_back({record.bytes, kDynamic});
  }
  if (lifetimes.empty() || lifetimes.size() > kMaxLaidOutAllocations) {
    remember(periods_without_layout_, period);
    return;
  }
  const StepLayout packed = lay_out_step(lifetimes, period);
  for (std::size_t k = 0; k < lifetimes.size(); ++k) {
    window_allocations[laid_out[k]].offset = packed.offsets[k];
  }
  // From the step's start; the program is at the window's start now.
  const std::size_t count = window_allocations.size();
  layout.allocations.reserve(count);
  for (std::size_t k = 0; k < count; ++k) {
    layout.allocations.push_back(window_allocations[(k + before_start) % count]);
  }
  layout.next = (count - before_start) % count;
  layout.arena_bytes = packed.arena_bytes;
  layout.peak_live_bytes = packed.peak_live_bytes;
  ready_ = std::move(layout);
}

}  // namespace stowage
