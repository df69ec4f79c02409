// TransferEngine: the copies between device memory and host memory, on streams of its own.
//
// One stream copies device-to-host (offloads), another host-to-device (reloads), so the two
// directions overlap each other and the compute stream. Every copy is a Transfer: it waits for
// an event the caller recorded (the compute that produced the data, or that allocated the
// destination), then copies, bracketed by two timing events. The second one is the transfer's
// completion: callers query it, make the compute stream wait for it, or (rarely, and counted)
// block the host on it. Busy time is measured on the device, from the brackets, so bandwidth is
// bytes over the time the copies really took, queueing excluded.
//
// Contract: thread-safe (one lock). A Transfer is shared: the engine keeps every transfer it
// started until its completion has been seen, so its events return to the engine's free list
// only once no copy uses them, whoever dropped it first. The engine must outlive its transfers'
// users; destroying it waits for every copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "base/bounded_wait.hpp"
#include "device/backend.hpp"

namespace stowage {

enum class TransferDirection : std::uint8_t { kToHost, kToDevice };

struct TransferStats {
  std::int64_t num_to_host = 0;
  std::int64_t num_to_device = 0;
  std::int64_t bytes_to_host = 0;   // of copies enqueued
  std::int64_t bytes_to_device = 0;
  std::int64_t busy_ns_to_host = 0;  // device time the completed copies took
  std::int64_t busy_ns_to_device = 0;
  std::int64_t completed_bytes_to_host = 0;  // of the copies whose busy time is counted
  std::int64_t completed_bytes_to_device = 0;
  std::int64_t num_syncs = 0;  // times the host blocked on a transfer

  // Bytes per second over the completed copies; 0 before the first completes.
  double bandwidth(TransferDirection direction) const noexcept;
};

class TransferEngine;

// One copy. Completion is final: once done() has returned true it always does.
class Transfer {
 public:
  TransferDirection direction() const noexcept { return direction_; }
  std::size_t bytes() const noexcept { return bytes_; }
  // The event that completes with the copy (for a stream to wait on).
  Event finished() const noexcept { return finished_; }

 private:
  friend class TransferEngine;
  Transfer(TransferDirection direction, std::size_t bytes, Event started, Event finished)
      : direction_(direction), bytes_(bytes), started_(started), finished_(finished) {}

  TransferDirection direction_;
  std::size_t bytes_;
  Event started_;
  Event finished_;
  bool complete_ = false;  // guarded by the engine's lock
};

using TransferHandle = std::shared_ptr<Transfer>;

class TransferEngine {
 public:
  // `waits`: the deadlines of wait and synchronize (Note [Bounded waits]).
  explicit TransferEngine(DeviceBackend& backend, const WaitLimits& waits = {});
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  Stream stream(TransferDirection direction) const noexcept {
    return direction == TransferDirection::kToHost ? to_host_ : to_device_;
  }
  // A timing event from the engine's free list: for the caller to record the work a copy must
  // follow, or for seconds_after. Give it back with recycle_event once nothing will wait on it
  // or query it again.
  Event borrow_event();
  void recycle_event(Event event);

  // Copies `bytes` from src to dst on the direction's stream, after the latest recording of
  // `after` (if any) has completed.
  TransferHandle copy(TransferDirection direction, void* dst, const void* src, std::size_t bytes,
                      std::optional<Event> after);
  // Whether the copy has completed. Never blocks.
  bool done(const TransferHandle& transfer);
  // Blocks the host until the copy has completed (counted in num_syncs when it had not); `what`
  // names it in a WaitTimeout. Bounded and interruptible (Note [Bounded waits]): throws
  // WaitTimeout or Interrupted, after which the copy still runs and its transfer stays valid.
  void wait(const TransferHandle& transfer, std::string_view what = "a copy");
  // Seconds from `event`'s latest recording (a timing event) to the transfer's completion, once
  // both have completed; nullopt before.
  std::optional<double> seconds_after(Event event, const TransferHandle& transfer);
  // Seconds from `start`'s latest recording to `end`'s (timing events), once both have
  // completed; nullopt before.
  std::optional<double> seconds_between(Event start, Event end);

  // Bytes of the direction's copies in flight, up to and including `through` (all of them:
  // nullptr): what a wait for it waits for, copies completing in stream order.
  std::size_t bytes_in_flight(TransferDirection direction, const Transfer* through);

  // Looks at the oldest transfers and accounts for those that completed. Cheap; never blocks.
  void poll();
  // Blocks until every copy has completed (counted once in num_syncs when any had not); bounded
  // and interruptible as wait, `what` naming the copies.
  void synchronize(std::string_view what = "the offload engine's copies");
  TransferStats stats();

 private:
  // Accounts for the completed transfers at the front of `in_flight` (in stream order) and moves
  // them to `completed`, which the caller lets go of after the lock (the last holder of a
  // transfer returns its events under the lock).
  void poll_locked(std::deque<TransferHandle>& in_flight, std::vector<TransferHandle>& completed);
  void account_locked(Transfer& transfer);
  Event take_event_locked();

  DeviceBackend& backend_;
  const WaitLimits waits_;
  Stream to_host_;
  Stream to_device_;
  std::mutex mutex_;  // guards everything below
  std::deque<TransferHandle> to_host_in_flight_;
  std::deque<TransferHandle> to_device_in_flight_;
  std::vector<Event> free_events_;  // timing events no copy or wait uses any more
  std::vector<Event> all_events_;   // every event made, destroyed with the engine
  TransferStats stats_;
};

}  // namespace stowage
