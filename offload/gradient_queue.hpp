// GradientQueue: the gradients of offloaded parameters on their way from the device to host
// buffers (Note [Gradients in flight]), as numbers.
//
// Note [Gradients in flight]
// Backward makes each offloaded parameter's gradient on the device; a copy on the engine's
// device-to-host stream takes it to a host buffer, ordered after the compute that made it, and the
// host side (the host parameter's .grad set to the buffer or added to, then its post-accumulate
// hooks) happens once that copy has landed, never by waiting for each copy as it is issued. The
// queue holds the gradients sent and not yet landed, oldest first: they land in the order they
// were sent (so the hooks run in the order torch ran them), and their bytes are bounded, so the
// device keeps a window of gradients (each held until its copy has read it), not every gradient:
// once the bytes in flight pass the bound, the oldest must land (the caller waits for them) until
// what stays in flight is within the bound, or is the newest gradient alone. Every gradient still
// in flight lands before backward returns.
//
// Accounting: bytes_in_flight() == the sum of the bytes of the gradients in flight; their tickets
// increase from the oldest to the newest, by one; the peak is the most bytes in flight at once.
//
// Contract: not thread-safe (the caller's lock). Numbers only: a gradient is a ticket and its
// bytes. Misuse (landing a gradient that is not the oldest in flight) throws LogicError and
// changes nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

namespace stowage::offload {

class GradientQueue {
 public:
  // At most `bound_bytes` in flight, unless one gradient alone is more.
  explicit GradientQueue(std::size_t bound_bytes) : bound_bytes_(bound_bytes) {}

  // A gradient of `bytes` sent: its ticket, the newest.
  std::uint64_t send(std::size_t bytes);
  // How many of the oldest gradients must land for what stays in flight to be within the bound
  // (or the newest alone).
  std::size_t over_bound() const;
  // The oldest gradient in flight has landed: `ticket` must be its ticket.
  void land(std::uint64_t ticket);
  // The oldest gradient's ticket (nullopt: none in flight).
  std::optional<std::uint64_t> oldest() const;

  std::size_t in_flight() const noexcept { return bytes_.size(); }
  std::size_t bytes_in_flight() const noexcept { return total_; }
  std::size_t peak_bytes_in_flight() const noexcept { return peak_; }
  std::size_t bound_bytes() const noexcept { return bound_bytes_; }
  std::uint64_t sent() const noexcept { return next_; }

  // Throws InternalError when the accounting above does not hold.
  void check_invariants() const;

 private:
  std::size_t bound_bytes_;
  std::deque<std::size_t> bytes_;  // of the gradients in flight, oldest first
  std::uint64_t next_ = 0;         // the next gradient's ticket
  std::size_t total_ = 0;
  std::size_t peak_ = 0;
};

}  // namespace stowage::offload
