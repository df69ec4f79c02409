// PendingStep: a step's host part run on a thread of its own, and the buckets it has landed, for
// update="exact" overlapped with the next forward (Note [Overlapped steps] in step_order.hpp).
//
// The work runs once, on the thread the constructor starts; it calls `land(bucket, arrival)` as
// each bucket's write-back part ends (`arrival`: what a reader of the bucket's parameters does
// before using them, e.g. making its stream wait for the copy; may be empty). Waiters block until
// their bucket has landed or the work has ended; the work's error is handed to the first wait that
// finds the work ended with one (or to finish()), once: never lost, never raised twice.
//
// Contract: land() from the work's thread only; wait_landed(), ended() and landed() from any
// thread (one mutex; a waiter blocks without holding it); finish() from the owner's thread. The
// work must end by itself (its own waits are bounded: Note [Bounded waits]); the destructor waits
// for it and drops an error never taken. Buckets are numbered 0..buckets-1; a number outside is LogicError.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace stowage::offload {

class PendingStep {
 public:
  using Arrival = std::function<void()>;
  using Land = std::function<void(std::size_t bucket, Arrival arrival)>;
  using Work = std::function<void(const Land& land)>;

  PendingStep(std::size_t buckets, Work work);
  ~PendingStep();
  PendingStep(const PendingStep&) = delete;
  PendingStep& operator=(const PendingStep&) = delete;

  // Blocks until `bucket` has landed or the work has ended; returns the bucket's arrival (empty
  // when it has none or never landed). Rethrows the work's error if it ended with one not yet taken.
  Arrival wait_landed(std::size_t bucket);
  // Blocks until the work has ended; rethrows its error if not yet taken.
  void finish();
  bool ended() const;
  bool landed(std::size_t bucket) const;

 private:
  void run(const Work& work);
  // With the lock held: the error, taken (null when none or already taken).
  std::exception_ptr take_error_locked();

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<bool> landed_;         // guarded by mutex_
  std::vector<Arrival> arrivals_;    // guarded by mutex_
  bool ended_ = false;               // guarded by mutex_
  std::exception_ptr error_;         // guarded by mutex_; null once taken
  std::thread thread_;               // last: started once the rest exists
};

}  // namespace stowage::offload
