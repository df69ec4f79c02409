// A backward's reloads replayed on paper: given each use's copy bytes and the compute after it,
// the link's bandwidth and a prefetch window, the stalls the offloader's rule would cause
// (Note [Reload simulation]).
//
// Note [Reload simulation]
// The offloader brings buffers back only when a reload asks for one: it copies that buffer if it
// is not back yet (the use then stalls until the copy completes), and then, in use order, the
// buffers after it while the bytes coming back ahead of use (the buffer in use excluded) stay
// within the window, at least the next one (within the window's bound). The host-to-device link
// is one queue: a copy starts when it is issued or when the copy before it completes, whichever
// is later, and takes bytes / bandwidth. A use arrives when the compute after the use before it
// is done (stalls push every later use back). The simulation follows exactly this, so:
//   - a larger window issues every copy at the same use or an earlier one, so every copy
//     completes no later and every use arrives no later: the step's end, and so its total stall
//     (end minus the compute), never grows with the window. choose_prefetch_window relies on it.
//   - a use whose buffer was never offloaded or was used where it lay (copy_bytes 0) only
//     triggers prefetches; a pass (one backward) starts with nothing ahead.
// It predicts what the measured compute and link allow, not the memory: the window's bound and
// the room the allocator has are the offloader's to enforce.
//
// Contract: pure functions of their arguments; thread-safe.
#pragma once

#include <cstddef>
#include <span>

namespace stowage {

struct ReloadUse {
  std::size_t copy_bytes = 0;   // bytes its copy back moves (0: nothing to copy)
  double compute_seconds = 0;   // compute from this use to the next use, stalls excluded
};

struct PredictedStalls {
  std::size_t count = 0;        // uses that wait for their copy
  double seconds = 0;           // how long they wait in all
  std::size_t peak_ahead_bytes = 0;  // the most bytes back (or coming back) ahead of use at once
};

// Whether one more buffer of `next_bytes` may come back ahead of use while `buffers_ahead`
// buffers of `bytes_ahead` bytes are already (the buffer in use excluded): within `window_bytes`,
// and at least one buffer when it fits `max_bytes` (Note [Prefetch window]).
bool admits_within_window(std::size_t buffers_ahead, std::size_t bytes_ahead, std::size_t next_bytes,
                          std::size_t window_bytes, std::size_t max_bytes) noexcept;

// The stalls of one pass of `uses` (in use order) over a link of `bandwidth` bytes per second
// (> 0) with a window of `window_bytes`, bounded by `max_bytes`.
PredictedStalls simulate_reloads(std::span<const ReloadUse> uses, double bandwidth, std::size_t window_bytes,
                                 std::size_t max_bytes);

// The least window, at most `max_bytes`, whose predicted stall is within `tolerance_seconds` of
// the widest window's, with each copy taking `copy_margin` times its time at `bandwidth` (so a
// link a little slower, or compute a little faster, than measured still finds copies done).
std::size_t choose_prefetch_window(std::span<const ReloadUse> uses, double bandwidth, std::size_t max_bytes,
                                   double copy_margin, double tolerance_seconds);

}  // namespace stowage
