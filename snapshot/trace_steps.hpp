// A device's trace cut into training steps, stowage.fit's own trial steps set apart.
//
// Steps end at stowage's step marks ("snapshot" events whose user_metadata is kMarkStep, written
// by stowage.mark_step()); a trace without marks (stock torch's) is cut where its allocations
// repeat (repeating_period): the shortest period P of at least kMinPeriod allocations over which
// the allocation sizes repeat (at least kRepeat of the pairs i, i + P equal) and the live bytes
// where its repetitions start stay alike or grow as a leaking step's do, each step starting where
// the trace's most frequent size first falls in the period. stowage.fit's own steps (its
// recording of the step, its rate probes and its trial step) lie between kTrialBegin and
// kTrialEnd marks: they are no part of the run, so the run's headline peak and its steps leave
// them out and report them apart. fit's trial spans (between a trial_begin and the next trial_end mark) are
// steps of their own, apart from the run's. Positions are LivePairs' (the trace's alloc and
// free_completed events, in order): `index[p]` the event index of position p (ascending),
// `live` the live bytes just after each. Pure functions; bad arguments raise LogicError.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

inline constexpr std::size_t kMinPeriod = 8;          // allocations a repetition holds at least
inline constexpr double kRepeat = 0.9;                // share of the pairs i, i + P with equal sizes
inline constexpr std::size_t kMaxCandidates = 64;     // periods tried, of each kind
inline constexpr double kSameLevel = 0.1;             // live bytes where steps start, alike within this share
inline constexpr double kLeakAlike = 0.25;            // ... or growing by amounts alike within this share
inline constexpr double kLeakShare = 0.5;             // of what a step allocates, at most
inline constexpr std::size_t kPeriodWindow = 200'000;  // allocations a period is looked for in
inline constexpr std::size_t kMaxSteps = 10'000;      // steps reported one by one

// The user_metadata of the "snapshot" events that mark them (stowage.mark_step(), stowage.fit).
inline constexpr const char* kMarkStep = "stowage.mark_step";
inline constexpr const char* kTrialBegin = "stowage.fit.trial_begin";
inline constexpr const char* kTrialEnd = "stowage.fit.trial_end";

// The marks of a trace (event indexes, ascending) and its number of events.
struct StepMarks {
  std::vector<std::int64_t> steps;         // "stowage.mark_step"
  std::vector<std::int64_t> trial_begins;  // "stowage.fit.trial_begin"
  std::vector<std::int64_t> trial_ends;    // "stowage.fit.trial_end"
  std::int64_t events = 0;
};

struct Step {
  std::int64_t number = 0;
  std::int64_t first_event = 0;  // the trace's event index where the step begins
  std::int64_t last_event = 0;   // ... and ends (its mark, or the event before the next step)
  Wide peak_bytes = 0;           // live bytes at the step's highest (first reached)
  std::int64_t peak_event = 0;
  Wide end_bytes = 0;            // live bytes when it ends
  bool fit_trial = false;        // stowage.fit's own step, not the run's
};

struct Steps {
  std::vector<Step> steps;
  std::string found_by;  // "marks", "repeating allocations", or "" where the trace shows none
};

// For each event index, whether it lies strictly inside one of fit's trial spans (a begin, and
// the first end after it, or the trace's end).
std::vector<std::uint8_t> in_trial(const StepMarks& marks, std::span<const std::int64_t> index);

// The shortest period (in allocations) over which `sizes` (the allocations' sizes, in order)
// repeat, and where the first repetition starts; none where none does. `alloc_live`: the live
// bytes just after each of those allocations (`exact`: compared with floats as Python's
// integers are, at_most). A period must hold over the whole trace from a quarter
// of the way in, and the live bytes where its repetitions start must be alike (a training step
// ends where it began) or grow as a leaking step's do: by about the same amount each time, a
// small part of what a period allocates. Periods tried: where the size a quarter in, or the
// largest size of the next stretch, recurs.
std::optional<std::pair<std::int64_t, std::int64_t>> repeating_period(std::span<const std::int64_t> sizes,
                                                                      std::span<const Wide> alloc_live, bool exact);

// The trace's steps: pieces ending at a step's end, and fit's trial spans; what lies between
// fit's trial spans and before a trial goes with the next step of the run. Numbered in order.
Steps cut_steps(const StepMarks& marks, std::span<const std::int64_t> index, const LiveSeries& live,
                std::span<const std::uint8_t> is_alloc, std::span<const std::int64_t> size);

// numpy's float64 sum of int64 values (`a.sum(dtype=np.float64)`): pairwise within each buffer
// of 8192 values, the buffers summed in order. Ties the float comparisons to Python's.
double numpy_float_sum(std::span<const std::int64_t> values);

}  // namespace stowage::snapshot
