// The order of the host part of an offloaded optimizer's step() and what makes it whole (Note
// [Whole steps] in slot_book.hpp): which bucket is updated and written back when, over a SlotBook.
// What a part does to a bucket is the caller's (StepWork): the step order decides only which
// parts run, in which order, and that each runs to its end whatever another throws.
//
// Contract: free functions; the work runs on the calling thread, in order. A part that threw runs
// once more (it resumes where it stopped: a bucket already updated or written back is not again),
// then the others, and the first error is rethrown after the last; an error from the second run
// ends the step where it stands (a device that is stuck: Note [Bounded waits]).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "offload/slot_book.hpp"

namespace stowage::offload {

struct StepWork {
  std::function<void(std::size_t bucket)> update;      // submits the bucket's update
  std::function<void(std::size_t bucket)> write_back;  // waits for it and writes its parameters back
  std::function<void()> end;                           // the step's end
  std::function<void(const std::string&)> at_point;    // a test seam called at each point; may be empty
};

// Runs every part, each once more where it threw, then rethrows the first error.
void run_whole(const std::vector<std::function<void()>>& parts);

// The host part of step(): each bucket without an update gets one ("update <bucket>"), then (not
// delayed) each bucket with one is written back ("write_back <bucket>"), then the end ("end").
void run_step(const SlotBook& book, const StepWork& work);

// update="exact" with staged buckets (Note [Staged buckets] in adam_buckets.hpp): bucket b's
// write-back ("write_back <b>") comes just before bucket b + max(slots - 1, 1)'s update ("update
// <...>"), so that a ring of `slots` buffers holds the bucket being copied out, the one being
// updated and the one being written back; then the remaining write-backs, then the end ("end").
// Without buckets the ring has no slot (0) and the step is its end alone.
void run_staged_step(const SlotBook& book, const StepWork& work, std::size_t slots);

// delayed: the pending buckets' updates written back ("write_back <bucket>"), whole.
void run_pending_write_backs(const SlotBook& book, const StepWork& work);

}  // namespace stowage::offload
