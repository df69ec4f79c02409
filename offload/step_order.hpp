// The order of the host part of an offloaded optimizer's step() and what makes it whole (Note
// [Whole steps] in slot_book.hpp): which bucket is updated and written back when, over a SlotBook.
// What a part does to a bucket is the caller's (StepWork): the step order decides only which
// parts run, in which order, and that each runs to its end whatever another throws.
//
// Contract: free functions; the work runs on the calling thread, in order. A part that threw runs
// once more (it resumes where it stopped: a bucket already updated or written back is not again),
// then the others, and the first error is rethrown after the last; an error from the second run
// ends the step where it stands (a device that is stuck: Note [Bounded waits]).
//
// Note [Overlapped steps]
// update="exact" with overlap=True runs the staged step (run_staged_step) on a thread of its own
// (PendingStep, offload/pending_step.hpp) and step() returns once it is started: the copies out,
// the host updates and the write-backs go on while the loop runs the next forward. The clipping
// coefficient and a GradScaler's verdict are known before it starts, and the step reads the
// parameters and gradients as they were at step(), so it computes what the step() that waited
// computed. What keeps that true is the reader's side: nothing may read or write a parameter of a
// bucket (or the gradient its copy out has not read yet) before the bucket has landed (its
// write-back part ended: `landed`), and the Python layer waits there (stowage/offload/landing.py).
// Buckets land in bucket order, which is parameter order: a forward that uses parameters in
// another order waits, at its first use of a late bucket, for the buckets before it (slower,
// still exact). "Whole" (Note [Whole steps]) is unchanged for the step itself: the pending step
// runs every part to its end whatever one throws; its error is raised at the first wait that
// meets it once the step has ended (or at the optimizer's next call), never lost.
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
  // Called once the bucket's write-back part has run to its end (written back, or nothing to
  // write): its parameters are final for this step. May be empty.
  std::function<void(std::size_t bucket)> landed;
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
// Each write-back part, once it ran to its end, calls work.landed(bucket).
void run_staged_step(const SlotBook& book, const StepWork& work, std::size_t slots);

// delayed: the pending buckets' updates written back ("write_back <bucket>"), whole.
void run_pending_write_backs(const SlotBook& book, const StepWork& work);

}  // namespace stowage::offload
