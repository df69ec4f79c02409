#include "offload/transfer_engine.hpp"

#include <cmath>
#include <exception>
#include <utility>

#include "base/errors.hpp"
#include "base/log.hpp"

namespace stowage {

namespace {

const char* direction_name(TransferDirection direction) {
  return direction == TransferDirection::kToHost ? "device to host" : "host to device";
}

}  // namespace

double TransferStats::bandwidth(TransferDirection direction) const noexcept {
  const bool to_host = direction == TransferDirection::kToHost;
  const std::int64_t bytes = to_host ? completed_bytes_to_host : completed_bytes_to_device;
  const std::int64_t ns = to_host ? busy_ns_to_host : busy_ns_to_device;
  return ns > 0 ? static_cast<double>(bytes) * 1e9 / static_cast<double>(ns) : 0.0;
}

TransferEngine::TransferEngine(DeviceBackend& backend, const WaitLimits& waits)
    : backend_(backend), waits_(waits), to_host_(backend.create_stream()) {
  try {
    to_device_ = backend.create_stream();
  } catch (...) {
    backend.destroy_stream(to_host_);
    throw;
  }
}

TransferEngine::~TransferEngine() {
  try {
    backend_.destroy_stream(to_host_);  // waits for the stream's copies
    backend_.destroy_stream(to_device_);
  } catch (const std::exception& error) {
    log_warning(detail::concat("the transfer engine's streams failed at shutdown: ", error.what()));
  }
  std::deque<TransferHandle> to_host;
  std::deque<TransferHandle> to_device;
  {
    std::lock_guard lock(mutex_);
    to_host.swap(to_host_in_flight_);
    to_device.swap(to_device_in_flight_);
  }
  to_host.clear();  // the last holders return their events, under the lock
  to_device.clear();
  for (const Event event : all_events_) {
    try {
      backend_.destroy_event(event);
    } catch (const std::exception& error) {
      log_warning(detail::concat("destroying a transfer event failed: ", error.what()));
    }
  }
}

Event TransferEngine::borrow_event() {
  std::lock_guard lock(mutex_);
  return take_event_locked();
}

Event TransferEngine::take_event_locked() {
  if (!free_events_.empty()) {
    const Event event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  const Event event = backend_.create_timing_event();
  all_events_.push_back(event);
  return event;
}

void TransferEngine::recycle_event(Event event) {
  std::lock_guard lock(mutex_);
  free_events_.push_back(event);
}

TransferHandle TransferEngine::copy(TransferDirection direction, void* dst, const void* src,
                                    std::size_t bytes, std::optional<Event> after) {
  const Stream on = stream(direction);
  std::lock_guard lock(mutex_);
  const Event started = take_event_locked();
  const Event finished = take_event_locked();
  // Returned to the free list when the last holder lets go: by then the copy has completed (the
  // engine holds every transfer until it sees the completion).
  TransferHandle transfer(new Transfer(direction, bytes, started, finished),
                          [this](Transfer* done) {
                            {
                              std::lock_guard recycle_lock(mutex_);
                              free_events_.push_back(done->started_);
                              free_events_.push_back(done->finished_);
                            }
                            delete done;
                          });
  if (after.has_value()) backend_.stream_wait_event(on, *after);
  backend_.record_event(started, on);
  backend_.copy_async(dst, src, bytes, on);
  backend_.record_event(finished, on);
  const bool to_host = direction == TransferDirection::kToHost;
  (to_host ? stats_.num_to_host : stats_.num_to_device) += 1;
  (to_host ? stats_.bytes_to_host : stats_.bytes_to_device) += static_cast<std::int64_t>(bytes);
  (to_host ? to_host_in_flight_ : to_device_in_flight_).push_back(transfer);
  return transfer;
}

bool TransferEngine::done(const TransferHandle& transfer) {
  std::vector<TransferHandle> completed;
  bool result = false;
  {
    std::lock_guard lock(mutex_);
    if (!transfer->complete_) {
      auto& in_flight = transfer->direction_ == TransferDirection::kToHost ? to_host_in_flight_
                                                                            : to_device_in_flight_;
      poll_locked(in_flight, completed);
    }
    result = transfer->complete_;
  }
  return result;  // `completed` lets go of its transfers after the lock
}

void TransferEngine::wait(const TransferHandle& transfer, std::string_view what) {
  if (done(transfer)) return;
  const Event finished = transfer->finished_;
  wait_until([&] { return backend_.query_event(finished); },
             {detail::concat(what, " (", direction_name(transfer->direction_), ")"),
              bytes_in_flight(transfer->direction_, transfer.get())},
             waits_);
  std::vector<TransferHandle> completed;
  std::lock_guard lock(mutex_);
  ++stats_.num_syncs;
  poll_locked(transfer->direction_ == TransferDirection::kToHost ? to_host_in_flight_
                                                                  : to_device_in_flight_,
              completed);
  STOWAGE_INTERNAL_ASSERT(transfer->complete_, "a transfer waited for is not complete");
}

std::optional<double> TransferEngine::seconds_after(Event event, const TransferHandle& transfer) {
  if (!done(transfer) || !backend_.query_event(event)) return std::nullopt;
  return backend_.elapsed_seconds(event, transfer->finished_);
}

std::optional<double> TransferEngine::seconds_between(Event start, Event end) {
  if (!backend_.query_event(start) || !backend_.query_event(end)) return std::nullopt;
  return backend_.elapsed_seconds(start, end);
}

void TransferEngine::poll() {
  std::vector<TransferHandle> completed;
  std::lock_guard lock(mutex_);
  poll_locked(to_host_in_flight_, completed);
  poll_locked(to_device_in_flight_, completed);
}

void TransferEngine::synchronize(std::string_view what) {
  bool waited = false;
  for (const TransferDirection direction : {TransferDirection::kToHost, TransferDirection::kToDevice}) {
    std::optional<Event> last;
    {
      std::lock_guard lock(mutex_);
      auto& in_flight = direction == TransferDirection::kToHost ? to_host_in_flight_ : to_device_in_flight_;
      if (in_flight.empty() || backend_.query_event(in_flight.back()->finished_)) continue;
      last = in_flight.back()->finished_;  // copies complete in stream order
    }
    waited = true;
    wait_until([&] { return backend_.query_event(*last); },
               {detail::concat(what, " (", direction_name(direction), ")"), bytes_in_flight(direction, nullptr)},
               waits_);
  }
  std::vector<TransferHandle> completed;
  std::lock_guard lock(mutex_);
  if (waited) ++stats_.num_syncs;
  poll_locked(to_host_in_flight_, completed);
  poll_locked(to_device_in_flight_, completed);
}

std::size_t TransferEngine::bytes_in_flight(TransferDirection direction, const Transfer* through) {
  std::lock_guard lock(mutex_);
  const auto& in_flight = direction == TransferDirection::kToHost ? to_host_in_flight_ : to_device_in_flight_;
  std::size_t bytes = 0;
  for (const TransferHandle& transfer : in_flight) {
    bytes += transfer->bytes_;
    if (transfer.get() == through) break;
  }
  return bytes;
}

TransferStats TransferEngine::stats() {
  poll();
  std::lock_guard lock(mutex_);
  return stats_;
}

void TransferEngine::poll_locked(std::deque<TransferHandle>& in_flight,
                                 std::vector<TransferHandle>& completed) {
  // A stream runs its copies in order: the first one not complete ends the scan.
  while (!in_flight.empty() && backend_.query_event(in_flight.front()->finished_)) {
    account_locked(*in_flight.front());
    completed.push_back(std::move(in_flight.front()));
    in_flight.pop_front();
  }
}

void TransferEngine::account_locked(Transfer& transfer) {
  transfer.complete_ = true;
  const double seconds = backend_.elapsed_seconds(transfer.started_, transfer.finished_);
  const auto ns = static_cast<std::int64_t>(std::llround(std::max(seconds, 0.0) * 1e9));
  const auto bytes = static_cast<std::int64_t>(transfer.bytes_);
  if (transfer.direction_ == TransferDirection::kToHost) {
    stats_.busy_ns_to_host += ns;
    stats_.completed_bytes_to_host += bytes;
  } else {
    stats_.busy_ns_to_device += ns;
    stats_.completed_bytes_to_device += bytes;
  }
}

}  // namespace stowage
