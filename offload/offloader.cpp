#include "offload/offloader.hpp"

#include <algorithm>
#include <exception>
#include <iterator>
#include <utility>

#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/numbers.hpp"

namespace stowage {

namespace {

// How many buffers that cannot come back (resident, still offloading) a prefetch scan passes over
// before it gives up: keeps reload cheap when a retained graph holds many resident buffers.
constexpr std::size_t kMaxSkippedBuffers = 256;

// The most uses a pass records: a backward over a retained graph, repeated without an offload
// between, is measured in passes of this many uses rather than in one record that keeps growing.
constexpr std::size_t kMaxPassUses = std::size_t{1} << 16;

constexpr auto kToHost = TransferDirection::kToHost;
constexpr auto kToDevice = TransferDirection::kToDevice;

}  // namespace

Offloader::Offloader(TransferEngine& engine, PinnedHostPool& pool, DeviceAllocate allocate,
                     DeviceRoom room, std::unique_ptr<PrefetchPolicy> policy)
    : engine_(engine),
      pool_(pool),
      allocate_(std::move(allocate)),
      room_(std::move(room)),
      policy_(std::move(policy)) {
  STOWAGE_CHECK(allocate_ != nullptr && policy_ != nullptr,
                "an offloader needs a device allocator and a prefetch policy");
}

Offloader::~Offloader() {
  try {
    engine_.synchronize("the offloader's copies at shutdown");
  } catch (const std::exception& error) {
    log_warning(detail::concat("waiting for the offloader's copies at shutdown failed: ", error.what()));
  }
  std::vector<DeviceBuffer> released;
  std::lock_guard lock(mutex_);
  for (auto& [id, entry] : entries_) forget_locked(entry, released);
  entries_.clear();
  for (Parked& parked : parked_) released.push_back(std::move(parked.device));
  parked_.clear();
  for (const PendingUse& use : pending_uses_) engine_.recycle_event(use.arrival);
  if (last_arrival_.has_value()) engine_.recycle_event(*last_arrival_);
  // `released` lets go after the lock (declared before it).
}

std::optional<Offloader::OffloadId> Offloader::offload(DeviceBuffer buffer, ComputeTimeline& compute) {
  STOWAGE_CHECK(buffer.data != nullptr && buffer.bytes > 0, "offload of an empty buffer");
  poll();
  void* host = pool_.try_allocate(buffer.bytes, engine_.stream(kToHost));
  std::lock_guard lock(mutex_);
  if (host == nullptr) {
    ++stats_.num_host_full;
    return std::nullopt;
  }
  const Event after = engine_.borrow_event();
  TransferHandle transfer;
  try {
    const bool follows = compute.record(after);
    transfer = engine_.copy(kToHost, host, buffer.data, buffer.bytes,
                            follows ? std::optional<Event>(after) : std::nullopt);
  } catch (...) {
    engine_.recycle_event(after);
    pool_.free(host);
    throw;
  }
  engine_.recycle_event(after);  // the copy's wait holds the recording it saw
  const OffloadId id = next_id_++;
  if (reloaded_since_offload_) {  // a forward after a backward
    ++pass_;
    reloaded_since_offload_ = false;
  }
  Entry& entry = entries_[id];
  entry.state = OffloadState::kOffloading;
  entry.bytes = buffer.bytes;
  entry.host = host;
  entry.device = std::move(buffer);
  entry.transfer = std::move(transfer);
  offloading_.push_back(id);
  ++stats_.buffers;
  ++stats_.num_offloads;
  stats_.bytes_offloaded += as_signed(entry.bytes);
  stats_.offloaded_bytes.update(as_signed(entry.bytes));
  return id;
}

DeviceBuffer Offloader::reload(OffloadId id, ComputeTimeline& compute) {
  poll();
  std::vector<Claim> claims;
  {
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(id);
    STOWAGE_CHECK(it != entries_.end(), "buffer ", id, " is not in the offloader (dropped already)");
    Entry& entry = it->second;
    STOWAGE_CHECK(!entry.claimed, "buffer ", id, " is being brought back by another thread");
    if (entry.state == OffloadState::kOffloading) {
      // Its device buffer is still held: use it, and let the copy finish for nothing (the buffer
      // keeps the copy, so a drop parks the buffer until the copy stops reading it).
      ++stats_.num_still_resident;
      pool_.free(entry.host);  // allocated on the copy's stream: reused after the copy, in order
      entry.host = nullptr;
      stats_.offloaded_bytes.update(-as_signed(entry.bytes));
      entry.state = OffloadState::kResident;
    }
    claims = claim_locked(id);
  }
  const bool needed = !claims.empty() && claims.front().id == id;
  try {
    allocate_claims(claims, needed, compute.stream());
  } catch (...) {
    unclaim(claims);
    throw;
  }
  std::vector<DeviceBuffer> released;
  std::lock_guard lock(mutex_);
  start_reloads_locked(claims, id, compute, released);
  Entry& entry = entries_.at(id);
  reloaded_since_offload_ = true;
  use_locked(entry, compute);
  return entry.device;  // `released` lets go after the lock (declared before it)
}

std::vector<Offloader::Claim> Offloader::claim_locked(OffloadId id) {
  std::vector<Claim> claims;
  const auto it = entries_.find(id);
  if (it->second.state == OffloadState::kOffloaded) {
    it->second.claimed = true;
    claims.push_back({id, it->second.bytes, {}});
  }
  std::size_t buffers_ahead = ahead_buffers_;
  std::size_t bytes_ahead = ahead_bytes_;
  if (it->second.state == OffloadState::kReloading) {  // the buffer in use is not ahead of use
    --buffers_ahead;
    bytes_ahead -= it->second.bytes;
  }
  std::size_t skipped = 0;
  for (auto earlier = std::make_reverse_iterator(it);
       earlier != entries_.rend() && skipped < kMaxSkippedBuffers; ++earlier) {
    Entry& entry = earlier->second;
    if (entry.state != OffloadState::kOffloaded || entry.claimed) {
      ++skipped;
      continue;
    }
    if (!policy_->admits(buffers_ahead, bytes_ahead, entry.bytes)) break;
    entry.claimed = true;
    claims.push_back({earlier->first, entry.bytes, {}});
    ++buffers_ahead;
    bytes_ahead += entry.bytes;
  }
  return claims;
}

void Offloader::allocate_claims(std::vector<Claim>& claims, bool needed, Stream stream) {
  for (std::size_t i = 0; i < claims.size(); ++i) {
    Claim& claim = claims[i];
    if (needed && i == 0) {
      claim.device = allocate_(claim.bytes, stream);  // the allocator's error reaches the caller
      STOWAGE_CHECK(claim.device.data != nullptr, "the device allocator returned no memory");
      continue;
    }
    // A prefetch only into memory free without eviction; the first that does not fit ends it.
    if (room_ != nullptr && room_() < claim.bytes) return;
    try {
      claim.device = allocate_(claim.bytes, stream);
    } catch (const std::exception&) {
      claim.device = {};
      return;
    }
    if (claim.device.data == nullptr) return;
  }
}

void Offloader::unclaim(std::vector<Claim>& claims) {
  {
    std::lock_guard lock(mutex_);
    for (const Claim& claim : claims) {
      const auto it = entries_.find(claim.id);
      if (it != entries_.end()) it->second.claimed = false;
    }
  }
  claims.clear();  // allocated buffers let go after the lock
}

void Offloader::start_reloads_locked(std::vector<Claim>& claims, OffloadId needed,
                                     ComputeTimeline& compute, std::vector<DeviceBuffer>& released) {
  const bool any = std::any_of(claims.begin(), claims.end(),
                               [](const Claim& claim) { return claim.device.data != nullptr; });
  std::optional<Event> after;
  Event allocated{};
  if (any) {
    allocated = engine_.borrow_event();
    if (compute.record(allocated)) after = allocated;  // the buffers were allocated before it
  }
  for (Claim& claim : claims) {
    const auto it = entries_.find(claim.id);
    if (it == entries_.end()) {  // dropped while claimed
      if (claim.device.data != nullptr) released.push_back(std::move(claim.device));
      continue;
    }
    Entry& entry = it->second;
    entry.claimed = false;
    if (claim.device.data == nullptr) continue;  // not allocated: stays offloaded
    entry.transfer = engine_.copy(kToDevice, claim.device.data, entry.host, entry.bytes, after);
    pool_.record_stream(entry.host, engine_.stream(kToDevice));  // its host block: freed once used
    entry.device = std::move(claim.device);
    entry.state = OffloadState::kReloading;
    ++ahead_buffers_;
    ahead_bytes_ += entry.bytes;
    ++stats_.num_reloads;
    stats_.bytes_reloaded += as_signed(entry.bytes);
    if (claim.id != needed) ++stats_.num_prefetched;
  }
  if (any) engine_.recycle_event(allocated);
}

void Offloader::use_locked(Entry& entry, ComputeTimeline& compute) {
  const Event arrival = engine_.borrow_event();
  const bool copied = entry.state == OffloadState::kReloading;
  try {
    if (copied) {
      compute.wait(entry.transfer->finished(), arrival,
                   {"a saved tensor's copy back to the device",
                    engine_.bytes_in_flight(TransferDirection::kToDevice, entry.transfer.get())});
    } else {
      compute.mark(arrival);
    }
  } catch (...) {  // interrupted or past its deadline: the buffer stays reloading, as it was
    engine_.recycle_event(arrival);
    throw;
  }
  if (!copied) {
    pending_uses_.push_back({arrival, nullptr, 0, pass_});
    return;
  }
  pending_uses_.push_back({arrival, entry.transfer, entry.bytes, pass_});
  entry.transfer.reset();
  release_host_locked(entry);  // reused once the copy back has completed (stream-ordered)
  entry.state = OffloadState::kResident;
  --ahead_buffers_;
  ahead_bytes_ -= entry.bytes;
}

void Offloader::observe_use_locked(double lateness) {
  if (lateness > 0) {
    ++stats_.num_stalls;
    stats_.stall_ns += static_cast<std::int64_t>(lateness * 1e9);
  }
  policy_->observe(lateness, engine_.stats().bandwidth(kToDevice));
}

void Offloader::measure_uses_locked() {
  while (!pending_uses_.empty()) {
    const PendingUse& use = pending_uses_.front();
    if (use.pass != measured_pass_ || pass_uses_.size() >= kMaxPassUses) end_pass_locked();
    measured_pass_ = use.pass;
    std::optional<double> lateness;
    if (use.transfer != nullptr) {
      lateness = engine_.seconds_after(use.arrival, use.transfer);
      if (!lateness.has_value()) return;
    }
    std::optional<double> since_last;
    if (last_arrival_.has_value()) {
      since_last = engine_.seconds_between(*last_arrival_, use.arrival);
      if (!since_last.has_value()) return;
      pass_uses_.back().compute_seconds = std::max(0.0, *since_last - last_stall_);
      engine_.recycle_event(*last_arrival_);
    }
    last_arrival_ = use.arrival;
    last_stall_ = std::max(0.0, lateness.value_or(0.0));
    pass_uses_.push_back({use.copy_bytes, 0.0});
    pending_uses_.pop_front();
    if (lateness.has_value()) observe_use_locked(*lateness);
  }
}

void Offloader::end_pass_locked() {
  if (!pass_uses_.empty()) policy_->observe_pass(pass_uses_, engine_.stats().bandwidth(kToDevice));
  pass_uses_.clear();
  if (last_arrival_.has_value()) engine_.recycle_event(*last_arrival_);
  last_arrival_.reset();
  last_stall_ = 0;
}

void Offloader::poll() {
  std::vector<DeviceBuffer> released;
  std::lock_guard lock(mutex_);
  poll_locked(released);
}

void Offloader::poll_locked(std::vector<DeviceBuffer>& released) {
  while (!offloading_.empty()) {
    const auto it = entries_.find(offloading_.front());
    if (it == entries_.end() || it->second.state != OffloadState::kOffloading) {
      offloading_.pop_front();  // dropped or used since
      continue;
    }
    if (!engine_.done(it->second.transfer)) break;  // copies complete in order
    set_offloaded_locked(it->second, released);
    offloading_.pop_front();
  }
  std::erase_if(parked_, [&](Parked& parked) {
    if (!engine_.done(parked.transfer)) return false;
    released.push_back(std::move(parked.device));
    return true;
  });
  measure_uses_locked();
}

void Offloader::synchronize() {
  engine_.synchronize("the offloader's copies at the end of the step");
  std::vector<DeviceBuffer> released;
  std::lock_guard lock(mutex_);
  poll_locked(released);
  if (pending_uses_.empty()) end_pass_locked();  // else the next pass's first use ends it
}

std::size_t Offloader::relieve_pressure(std::size_t bytes, Stream) noexcept {
  std::vector<DeviceBuffer> released;
  std::size_t freed = 0;
  try {
    std::lock_guard lock(mutex_);
    poll_locked(released);
    for (const DeviceBuffer& buffer : released) freed += buffer.bytes;
    while (freed < bytes && !offloading_.empty()) {
      const auto it = entries_.find(offloading_.front());
      if (it != entries_.end() && it->second.state == OffloadState::kOffloading) {
        engine_.wait(it->second.transfer, "a tensor's copy to host memory, to free its device memory");
        ++stats_.num_pressure_waits;
        freed += it->second.bytes;
        set_offloaded_locked(it->second, released);
      }
      offloading_.pop_front();
    }
    for (Parked& parked : parked_) {
      engine_.wait(parked.transfer, "a copy that still reads freed device memory");
      ++stats_.num_pressure_waits;
      freed += parked.device.bytes;
      released.push_back(std::move(parked.device));
    }
    parked_.clear();
    if (freed < bytes) freed += let_go_of_prefetches_locked(bytes - freed, released);
    stats_.pressure_bytes += as_signed(freed);
  } catch (const Interrupted&) {
    // Ctrl-C: give up making room (the request then fails as out of memory, and Python raises
    // the KeyboardInterrupt its handler noted); the copies go on and are let go when complete.
  } catch (const std::exception& error) {
    log_warning(detail::concat("the offloader could not relieve memory pressure: ", error.what()));
  }
  released.clear();  // frees the device memory, without the offloader's lock
  return freed;
}

void Offloader::drop(OffloadId id) noexcept {
  std::vector<DeviceBuffer> released;
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return;
  forget_locked(it->second, released);
  entries_.erase(it);
}

void Offloader::note_used_in_place(OffloadId id) noexcept {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(id);
  if (it != entries_.end() && it->second.state == OffloadState::kOffloading) ++stats_.num_still_resident;
}

void Offloader::set_offloaded_locked(Entry& entry, std::vector<DeviceBuffer>& released) {
  released.push_back(std::move(entry.device));
  entry.device = {};
  entry.transfer.reset();
  entry.state = OffloadState::kOffloaded;
}

void Offloader::release_host_locked(Entry& entry) {
  pool_.free(entry.host);
  entry.host = nullptr;
  stats_.offloaded_bytes.update(-as_signed(entry.bytes));
}

// The buffers coming back ahead of use, furthest from use first (the lowest ids: buffers come back
// in the reverse of their offload order), until `bytes` are let go: each waits for its copy,
// gives its device buffer back and is offloaded again, its host block still holding the bytes.
std::size_t Offloader::let_go_of_prefetches_locked(std::size_t bytes, std::vector<DeviceBuffer>& released) {
  std::size_t freed = 0;
  for (auto it = entries_.begin(); it != entries_.end() && freed < bytes && ahead_buffers_ > 0; ++it) {
    Entry& entry = it->second;
    if (entry.state != OffloadState::kReloading) continue;
    engine_.wait(entry.transfer, "a tensor's copy back to the device, to let go of it");
    ++stats_.num_prefetches_let_go;
    freed += entry.bytes;
    --ahead_buffers_;
    ahead_bytes_ -= entry.bytes;
    set_offloaded_locked(entry, released);
  }
  return freed;
}

void Offloader::forget_locked(Entry& entry, std::vector<DeviceBuffer>& released) {
  switch (entry.state) {
    case OffloadState::kOffloading:
      pool_.free(entry.host);  // stream-ordered behind the copy that writes it
      stats_.offloaded_bytes.update(-as_signed(entry.bytes));
      parked_.push_back({std::move(entry.transfer), std::move(entry.device)});
      break;
    case OffloadState::kOffloaded:
      pool_.free(entry.host);
      stats_.offloaded_bytes.update(-as_signed(entry.bytes));
      break;
    case OffloadState::kReloading:
      release_host_locked(entry);
      parked_.push_back({std::move(entry.transfer), std::move(entry.device)});
      --ahead_buffers_;
      ahead_bytes_ -= entry.bytes;
      break;
    case OffloadState::kResident:
      if (entry.transfer != nullptr && !engine_.done(entry.transfer)) {
        parked_.push_back({std::move(entry.transfer), std::move(entry.device)});  // still read
      } else {
        released.push_back(std::move(entry.device));
      }
      break;
  }
  entry.host = nullptr;
  --stats_.buffers;
}

OffloadState Offloader::state(OffloadId id) const {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(id);
  STOWAGE_CHECK(it != entries_.end(), "buffer ", id, " is not in the offloader");
  return it->second.state;
}

void Offloader::set_prefetch_policy(std::unique_ptr<PrefetchPolicy> policy) {
  STOWAGE_CHECK(policy != nullptr, "an offloader needs a prefetch policy");
  std::lock_guard lock(mutex_);
  policy_ = std::move(policy);
  pass_uses_.clear();  // measured for the policy replaced: the new one starts from the next use
  if (last_arrival_.has_value()) engine_.recycle_event(*last_arrival_);
  last_arrival_.reset();
}

OffloaderStats Offloader::stats() const {
  std::lock_guard lock(mutex_);
  OffloaderStats out = stats_;
  out.window_bytes = as_signed(policy_->window_bytes());
  return out;
}

void Offloader::check_invariants() const {
  std::lock_guard lock(mutex_);
  std::size_t offloaded = 0;
  std::size_t ahead = 0;
  std::size_t ahead_bytes = 0;
  for (const auto& [id, entry] : entries_) {
    const bool on_host = entry.state != OffloadState::kResident;
    const bool copying = entry.state == OffloadState::kOffloading || entry.state == OffloadState::kReloading;
    // A resident buffer may keep the offload that still reads it (Note [Offload states]).
    STOWAGE_INTERNAL_ASSERT(on_host == (entry.host != nullptr), "buffer ", id, ": host block");
    STOWAGE_INTERNAL_ASSERT((entry.state != OffloadState::kOffloaded) == (entry.device.data != nullptr),
                            "buffer ", id, ": device buffer");
    STOWAGE_INTERNAL_ASSERT(
        entry.state == OffloadState::kResident || copying == (entry.transfer != nullptr), "buffer ", id,
        ": transfer");
    if (on_host) offloaded += entry.bytes;
    if (entry.state == OffloadState::kReloading) {
      ++ahead;
      ahead_bytes += entry.bytes;
    }
  }
  STOWAGE_INTERNAL_ASSERT(as_signed(offloaded) == stats_.offloaded_bytes.current,
                          "offloaded bytes ", offloaded, " vs ", stats_.offloaded_bytes.current);
  STOWAGE_INTERNAL_ASSERT(as_signed(entries_.size()) == stats_.buffers, "buffer count");
  STOWAGE_INTERNAL_ASSERT(ahead == ahead_buffers_ && ahead_bytes == ahead_bytes_, "buffers ahead");
}

}  // namespace stowage
