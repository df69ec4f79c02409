// How far ahead of backward the offloader brings offloaded buffers back (Note [Prefetch window]).
//
// Note [Prefetch window]
// Backward uses buffers in the reverse of the order forward offloaded them. A reload started
// when the buffer before it is used is hidden if the compute between the two uses takes at least
// its copy time; where it does not (a large buffer after a short op) the compute stalls. Buffers
// brought in earlier hide more, but hold device memory until used. The window is the bytes that
// may be back or coming back ahead of use, the buffer in use excluded, and at least the one
// buffer after it.
//
// MeasuredPrefetch (prefetch="auto") chooses the window from what a pass (one backward) measured:
// each use's copy bytes, the compute from it to the next use (its arrival events, stalls taken
// out) and the link's measured bandwidth. It replays the pass on paper (Note [Reload
// simulation]) and takes the least window whose predicted stall is that of the widest window,
// with every copy taken as kCopyMargin times slower than measured: each reload is then issued at
// least its copy time (and the copies queued before it) ahead of its use, with the least device
// memory held. Every completed pass chooses again, so the window follows the batch, the model
// and the link. Before any pass has completed it follows AdaptivePrefetch: a look-ahead time,
// `lead`, the window being the bytes the link moves in `lead`; a copy late by t lengthens `lead`
// by t, one early by t shortens it by a quarter of t. The window never passes its bound
// (max_prefetch), and the offloader prefetches only into memory the allocator has free without
// evicting anything. FixedPrefetch keeps a set number of buffers ahead (0: each buffer comes back
// when it is used).
//
// Contract: not thread-safe; the offloader calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "offload/reload_simulation.hpp"

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
  // A pass (one backward) completed: its uses in order (Note [Reload simulation]) over a link of
  // `bandwidth` bytes per second (0: unknown).
  virtual void observe_pass(std::span<const ReloadUse> uses, double bandwidth) = 0;
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
  void observe_pass(std::span<const ReloadUse>, double) override {}
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
  void observe_pass(std::span<const ReloadUse>, double) override {}
  std::size_t window_bytes() const override;
  double lead_seconds() const noexcept { return lead_; }

 private:
  std::size_t max_bytes_;
  double lead_ = 0;       // seconds of link time the window covers
  double bandwidth_ = 0;  // bytes per second
};

// The window chosen from the last completed pass's measurements; AdaptivePrefetch before one.
class MeasuredPrefetch final : public PrefetchPolicy {
 public:
  // Each copy is planned as taking this many times its measured time.
  static constexpr double kCopyMargin = 1.25;
  // A window whose predicted stall exceeds the least by at most this share of the pass's compute
  // is as good.
  static constexpr double kStallTolerance = 0.002;

  // The window never passes `max_bytes`.
  explicit MeasuredPrefetch(std::size_t max_bytes) : max_bytes_(max_bytes), before_measuring_(max_bytes) {}
  bool admits(std::size_t buffers_ahead, std::size_t bytes_ahead,
              std::size_t next_bytes) const override;
  void observe(double lateness_seconds, double bandwidth) override;
  void observe_pass(std::span<const ReloadUse> uses, double bandwidth) override;
  std::size_t window_bytes() const override;
  // The window chosen from a pass; nullopt before one completed (with a known bandwidth).
  std::optional<std::size_t> chosen_window() const noexcept { return chosen_; }

 private:
  std::size_t max_bytes_;
  AdaptivePrefetch before_measuring_;
  std::optional<std::size_t> chosen_;
};

}  // namespace stowage
