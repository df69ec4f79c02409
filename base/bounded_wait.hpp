// wait_until: the one way stowage waits for the device's work (copies, events, streams) to
// complete: polled in short slices, interruptible, and with a deadline.
//
// Note [Bounded waits]
// A wait that never ends hangs a training job, and one that ignores Ctrl-C makes the user kill
// it. So every wait for copies or events (the offload engine's end of step and mark_step, a
// buffer coming back, the offloader relieving memory pressure) polls its condition with sleeps
// that grow from 10 us to 2 ms (a wait ends at most about its own length late, and never more
// than 2 ms; a GPU's event query costs a microsecond) and between polls:
//   - gives up with Interrupted once the user interrupts the process (SIGINT, InterruptWatch),
//     within a slice; the Python layer turns that into KeyboardInterrupt (unless the thread
//     holds interrupts, InterruptHold: then it waits on, to its deadline, for work that must be
//     whole once begun);
//   - gives up with WaitTimeout, naming what it waited for and how much, at its deadline:
//     kWaitSlack plus the bytes the awaited work moves at kFloorBytesPerSecond. The floor is
//     the slowest link stowage accepts (CPU mode's simulated link has it as its minimum) and
//     a tenth of a GPU's pageable copies: a copy that slow means the device is stuck. The slack
//     covers work queued ahead of the copies (a device busy with the step's compute).
// The work goes on after either: the caller keeps what it waited for until it completes.
//
// Contract: wait_until is thread-safe and may be called under the caller's locks (it takes
// none of its own beyond InterruptWatch's, briefly, and never the GIL). `done` is called
// from the waiting thread only, and must be cheap and must not block.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace stowage {

inline constexpr double kFloorBytesPerSecond = 10e6;  // 10 MB/s
inline constexpr std::chrono::nanoseconds kWaitSlack = std::chrono::seconds(10);

// What a wait is for: named in its WaitTimeout ("offloads of 3 tensors"), and the bytes the
// awaited work moves, which set its deadline.
struct WaitFor {
  std::string what;
  std::size_t bytes = 0;
};

// The deadline's parts (defaults: Note [Bounded waits]); tests make them short.
struct WaitLimits {
  double floor_bytes_per_second = kFloorBytesPerSecond;
  std::chrono::nanoseconds slack = kWaitSlack;

  std::chrono::nanoseconds deadline(std::size_t bytes) const;
};

// Returns once `done()` is true. Throws Interrupted when SIGINT arrives first, WaitTimeout at
// the deadline; exceptions from `done` pass through.
void wait_until(const std::function<bool()>& done, const WaitFor& wait, const WaitLimits& limits = {});

}  // namespace stowage
