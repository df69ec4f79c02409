// How far ahead of backward the offloader brings offloaded buffers back (Note [Prefetch window]).
//
// Note [Prefetch window]
// Backward uses buffers in the reverse of the order forward offloaded them. A reload started
// when the buffer before it is used is hidden if the compute between the two uses takes at least
// its copy time; where it does not (a large buffer after a short op) the compute stalls. Buffers
// brought in earlier hide more, but hold device memory until used. The adaptive policy keeps a
// look-ahead time, `lead`: the window is the bytes the host-to-device link moves in `lead` at its
// measured bandwidth, and at least the one buffer after the buffer in use. Each use measures how
// late its copy was (from the moment the compute reached its wait to the copy's completion, on
// the device): a copy late by t lengthens `lead` by t (it should have started t earlier); one
// early by t shortens it by a quarter of t. So the window follows the link's bandwidth and the
// compute time between uses, settling where stalls stop at the least device memory, and moves
// when either changes. The offloader prefetches only into memory the allocator has free without
// evicting anything. FixedPrefetch keeps a set number of buffers ahead (0: each buffer comes back
// when it is used).
//
// Contract: not thread-safe; the offloader calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stowage {

class PrefetchPolicy {
 public:
  virtual ~PrefetchPolicy() = default;
  // Whether one more buffer of `next_bytes` may come back ahead of use while `buffers_ahead`
  // buffers of `bytes_ahead` bytes are already coming back or back and unused.
  virtual bool admits(std::size_t buffers_ahead, std::size_t bytes_ahead,
                      std::size_t next_bytes) const = 0;
  // A use of a buffer whose copy completed `lateness_seconds` after the compute reached it
  // (negative: before); the link moves `bandwidth` bytes per second (0: unknown yet).
  virtual void observe(double lateness_seconds, double bandwidth) = 0;
  // The current window in bytes (for the statistics).
  virtual std::size_t window_bytes() const = 0;
};

class FixedPrefetch final : public PrefetchPolicy {
 public:
  explicit FixedPrefetch(std::size_t buffers) : buffers_(buffers) {}
  bool admits(std::size_t buffers_ahead, std::size_t, std::size_t) const override {
    return buffers_ahead < buffers_;
  }
  void observe(double, double) override {}
  std::size_t window_bytes() const override { return 0; }

 private:
  std::size_t buffers_;
};

class AdaptivePrefetch final : public PrefetchPolicy {
 public:
  // The window never passes `max_bytes`.
  explicit AdaptivePrefetch(std::size_t max_bytes) : max_bytes_(max_bytes) {}
  bool admits(std::size_t buffers_ahead, std::size_t bytes_ahead,
              std::size_t next_bytes) const override;
  void observe(double lateness_seconds, double bandwidth) override;
  std::size_t window_bytes() const override;
  double lead_seconds() const noexcept { return lead_; }

 private:
  std::size_t max_bytes_;
  double lead_ = 0;       // seconds of link time the window covers
  double bandwidth_ = 0;  // bytes per second
};

}  // namespace stowage
