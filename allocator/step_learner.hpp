// StepLearner: learns the allocation sequence of a repeating training step, and hands the
// caching allocator a step layout for it (Note [Learned placement] in learned_placement.hpp).
//
// Learning: the allocator reports each allocation it makes (its rounded size) and each free of
// one; the learner keeps them as a sequence of events: "allocate n bytes" and "free the
// allocation made k allocations ago". A step has repeated when the last P events equal the P
// before them and the bytes live at both ends agree (a forward pass repeats its layers, but
// with more live each time, so layers are not steps; and a step climbs at least halfway from
// the fewest bytes live since learning began to the most, which a loop inside a step, such as
// an optimizer's over its layers, does not). Boundaries come from mark_step() when the
// program calls it (then only whole marked steps count); otherwise the learner looks for the
// longest such P each time the events held grow by a quarter (a Z-function over the reversed
// sequence, O(events); so O(1) amortised per event), taking
// the shortest P that divides it. The layout places every allocation of the step whose lifetime
// is shorter than a step, with lifetimes read from the two repetitions (an allocation alive at
// the end of the step is freed where the previous step's same allocation was freed in this one),
// by lay_out_step; allocations that live longer are left to the dynamic path.
//
// Placed: each allocation asks peek_entry() and, once served, commit_entry() (next_entry()
// does both); a size other than the layout's, or a mark_step() partway through the layout, is a
// departure: the allocator goes back to its dynamic path and the learner to learning,
// remembering the period so the same false step is not learned twice. After
// kMaxDepartures the learner stops for good (off).
//
// Memory is bounded: at most kMaxEvents events are kept (the older half is dropped), so steps
// of more than kMaxEvents / 2 events, or layouts of more than kMaxLaidOutAllocations, are never
// laid out.
//
// Contract: not thread-safe (the allocator's lock guards it). Record ids are never reused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace stowage {

class StepLearner {
 public:
  static constexpr std::uint64_t kNoRecord = UINT64_MAX;
  static constexpr std::size_t kDynamic = SIZE_MAX;  // an allocation the layout leaves dynamic
  static constexpr std::size_t kMaxEvents = std::size_t{1} << 16;
  // Packing is O(n^2) and runs once per layout under the allocator's lock: the cap bounds that
  // pause.
  static constexpr std::size_t kMaxLaidOutAllocations = 8192;
  static constexpr std::size_t kMaxRejectedPeriods = 64;
  static constexpr std::size_t kMinPeriodEvents = 8;
  // A step found without marks makes at least this many allocations: a training step makes
  // hundreds, and short loops inside one (over a batch's chunks, an optimizer's groups) repeat
  // with few. A repeat whose shortest repeating unit makes fewer is such a loop, not a step.
  static constexpr std::size_t kMinFoundAllocations = 32;
  static constexpr int kMaxDepartures = 16;

  enum class Phase : std::uint8_t { kLearning, kPlaced, kOff };

  struct LayoutEntry {
    std::size_t bytes = 0;
    std::size_t offset = kDynamic;  // in the arena; kDynamic: served by the dynamic path
  };
  struct Layout {
    // In the order the step makes them, from the step's start: its mark, or (found without
    // marks) the point where the fewest bytes are live, where the step boundary must be.
    std::vector<LayoutEntry> allocations;
    std::size_t next = 0;  // the allocation the program makes next, when the layout is taken
    std::size_t arena_bytes = 0;
    std::size_t peak_live_bytes = 0;  // of the laid-out allocations: the packing's lower bound
    std::size_t period_events = 0;
  };

  Phase phase() const noexcept { return phase_; }

  // --- learning ---
  // Records an allocation of `bytes`; returns its record id (kNoRecord unless learning).
  std::uint64_t record_malloc(std::size_t bytes);
  // Records the free of a recorded allocation; ids from before the last reset are ignored.
  void record_free(std::uint64_t record);
  // A layout found by the last record_malloc / record_free / mark_step, moved out; the learner is
  // then placed. nullopt when there is none.
  std::optional<Layout> take_layout();

  // --- step boundaries ---
  // Returns true when the step ended partway through the layout: a departure (the caller
  // dissolves the layout).
  bool mark_step();

  // --- placed ---
  // The layout's next allocation for a request of `bytes`, or nullptr when the request departs
  // from the layout (the learner has then already gone back to learning). Until the program
  // reaches the step's start, requests are checked against the layout but left dynamic.
  // peek_entry does not move on: commit_entry() does, once the request has been served (a
  // request that fails, and is tried again, is the same request).
  const LayoutEntry* peek_entry(std::size_t bytes);
  void commit_entry();
  // peek_entry and, unless it departed, commit_entry.
  const LayoutEntry* next_entry(std::size_t bytes);
  // True while the layout waits for the step's start (see next_entry).
  bool waiting() const noexcept { return waiting_; }
  // Leaves the layout (the allocator could not place an allocation where it said).
  void depart();
  // Forgets everything learned and starts learning again (empty_cache gives the arena back);
  // departures so far still count.
  void reset();

  std::size_t layouts_made() const noexcept { return layouts_made_; }
  int departures() const noexcept { return departures_; }
  std::size_t events_held() const noexcept { return symbols_.size(); }

 private:
  struct Record {
    std::size_t bytes = 0;
    std::size_t event = 0;       // absolute index of its allocation event
    std::size_t free_event = 0;  // absolute index of its free; kNotFreed until then
  };
  static constexpr std::size_t kNotFreed = SIZE_MAX;

  void push_event(std::uint64_t symbol, std::uint64_t record);
  void maybe_detect();
  // The period of the step the recent events repeat (0: none).
  std::size_t detect_period();
  bool repeats(std::size_t period) const;
  static bool contains(const std::vector<std::size_t>& periods, std::size_t period);
  static void remember(std::vector<std::size_t>& periods, std::size_t period);
  // Builds the layout from the last `period` events (which repeat the `period` before them).
  // Without marks (`from_fewest_live`), the layout's step starts after the event with the fewest
  // bytes live.
  void build_layout(std::size_t period, bool from_fewest_live);
  void trim();
  void clear_events();

  Phase phase_ = Phase::kLearning;
  // Events since learning (re)started, oldest first; event i has absolute index event_base_ + i.
  std::vector<std::uint64_t> symbols_;   // alloc: bytes << 1; free: (allocations ago << 1) | 1
  std::vector<std::int64_t> live_;       // bytes of recorded allocations live after each event
  std::vector<std::uint64_t> event_record_;  // the record an alloc event made; kNoRecord: a free
  std::size_t event_base_ = 0;
  std::vector<Record> records_;  // record id r is records_[r - record_base_]
  std::uint64_t record_base_ = 0;
  std::uint64_t next_record_ = 0;
  std::int64_t live_bytes_ = 0;
  std::size_t next_check_ = 0;  // events held at which detection next runs
  bool marked_ = false;         // mark_step() has been called: boundaries come from it
  std::vector<std::size_t> marks_;  // absolute event indices of the last marks
  std::vector<std::size_t> rejected_periods_;        // departed from
  std::vector<std::size_t> periods_without_layout_;  // repeated; nothing (or too much) to lay out
  std::optional<Layout> ready_;
  // detect_period's buffers, kept to spare allocations.
  std::vector<std::uint64_t> reversed_;
  std::vector<std::size_t> z_;
  std::vector<std::int64_t> highest_since_;
  std::vector<std::size_t> allocations_since_;
  Layout layout_;
  std::size_t cursor_ = 0;  // the layout's next allocation
  bool waiting_ = false;
  LayoutEntry waiting_entry_;  // what next_entry returns while waiting
  std::size_t layouts_made_ = 0;
  int departures_ = 0;
};

}  // namespace stowage
