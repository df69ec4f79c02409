// InterruptWatch: whether the user interrupted the process (SIGINT, Ctrl-C) while a wait was
// in progress (Note [Bounded waits] in base/bounded_wait.hpp).
//
// While at least one watch is alive, SIGINT first counts the interrupt, then runs the handler
// that was installed before (Python's, which makes the interpreter raise KeyboardInterrupt), so
// nothing else changes: a wait polls interrupted() and gives up, and Python raises
// KeyboardInterrupt as it would have. Where SIGINT has no handler (its default ends the process,
// as in a plain C++ program, or it is ignored) nothing is installed and interrupted() stays
// false: the signal does what it did. The last watch to go puts the previous handler back,
// unless something else replaced ours meanwhile.
//
// Contract: thread-safe; watches may overlap on any threads. Cheap to make when another watch
// is alive (a counter under a mutex); the first costs two sigaction calls.
//
// InterruptHold: while one is alive on a thread, the waits of that thread do not give up when
// the user interrupts (they go on to their deadline): work that must be whole once begun (an
// optimizer step: its updates and copies, Note [Whole steps] in offload/slot_book.hpp) is
// finished before the interrupt is acted on. The signal
// itself still runs the handler before ours (Python notes it and raises KeyboardInterrupt where
// its caller lets it). Contract: per thread, nested holds allowed; made and destroyed on one
// thread.
#pragma once

#include <cstdint>

namespace stowage {

class InterruptWatch {
 public:
  InterruptWatch();
  ~InterruptWatch();
  InterruptWatch(const InterruptWatch&) = delete;
  InterruptWatch& operator=(const InterruptWatch&) = delete;

  // Whether SIGINT arrived since this watch was made.
  bool interrupted() const noexcept;

 private:
  std::uint64_t seen_;  // the interrupt count when the watch was made
};

class InterruptHold {
 public:
  InterruptHold() noexcept;
  ~InterruptHold();
  InterruptHold(const InterruptHold&) = delete;
  InterruptHold& operator=(const InterruptHold&) = delete;

  // Whether a hold is alive on the calling thread.
  static bool active() noexcept;
};

}  // namespace stowage
