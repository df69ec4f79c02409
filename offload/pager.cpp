#include "offload/pager.hpp"

#include <algorithm>
#include <exception>
#include <iterator>
#include <utility>

#include "allocator/base/errors.hpp"
#include "allocator/base/log.hpp"
#include "allocator/base/numbers.hpp"

namespace stowage {

namespace {

// How many pages that cannot come back (resident, still paging) a prefetch scan passes over
// before it gives up: keeps page_in cheap when a retained graph holds many resident pages.
constexpr std::size_t kMaxSkippedPages = 256;

constexpr auto kToHost = TransferDirection::kToHost;
constexpr auto kToDevice = TransferDirection::kToDevice;

}  // namespace

Pager::Pager(DeviceBackend& backend, TransferEngine& engine, PinnedHostPool& pool,
             DeviceAllocate allocate, DeviceRoom room, std::unique_ptr<PrefetchPolicy> policy)
    : backend_(backend),
      engine_(engine),
      pool_(pool),
      allocate_(std::move(allocate)),
      room_(std::move(room)),
      policy_(std::move(policy)) {
  STOWAGE_CHECK(allocate_ != nullptr && policy_ != nullptr,
                "a pager needs a device allocator and a prefetch policy");
}

Pager::~Pager() {
  try {
    engine_.synchronize("the pager's copies at shutdown");
  } catch (const std::exception& error) {
    log_warning(detail::concat("waiting for the pager's copies at shutdown failed: ", error.what()));
  }
  std::vector<DeviceBuffer> released;
  std::lock_guard lock(mutex_);
  for (auto& [id, page] : pages_) forget_locked(page, released);
  pages_.clear();
  for (Parked& parked : parked_) released.push_back(std::move(parked.device));
  parked_.clear();
  for (const PendingUse& use : pending_uses_) engine_.recycle_event(use.arrival);
  // `released` lets go after the lock (declared before it).
}

std::optional<Pager::PageId> Pager::page_out(DeviceBuffer buffer, ComputeTimeline& compute) {
  STOWAGE_CHECK(buffer.data != nullptr && buffer.bytes > 0, "page_out of an empty buffer");
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
  const PageId id = next_id_++;
  Page& page = pages_[id];
  page.state = PageState::kPagingOut;
  page.bytes = buffer.bytes;
  page.host = host;
  page.device = std::move(buffer);
  page.transfer = std::move(transfer);
  paging_out_.push_back(id);
  ++stats_.pages;
  ++stats_.num_page_outs;
  stats_.bytes_paged_out += as_signed(page.bytes);
  stats_.offloaded_bytes.update(as_signed(page.bytes));
  return id;
}

DeviceBuffer Pager::page_in(PageId id, ComputeTimeline& compute) {
  poll();
  std::vector<Claim> claims;
  {
    std::lock_guard lock(mutex_);
    const auto it = pages_.find(id);
    STOWAGE_CHECK(it != pages_.end(), "page ", id, " is not in the pager (dropped already)");
    Page& page = it->second;
    STOWAGE_CHECK(!page.claimed, "page ", id, " is being brought back by another thread");
    if (page.state == PageState::kPagingOut) {
      // Its device buffer is still held: use it, and let the copy finish for nothing (the page
      // keeps the copy, so a drop parks the buffer until the copy stops reading it).
      ++stats_.num_still_resident;
      pool_.free(page.host);  // allocated on the copy's stream: reused after the copy, in order
      page.host = nullptr;
      stats_.offloaded_bytes.update(-as_signed(page.bytes));
      page.state = PageState::kResident;
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
  start_page_ins_locked(claims, id, compute, released);
  Page& page = pages_.at(id);
  if (page.state == PageState::kPagingIn) wait_for_locked(page, compute);
  return page.device;  // `released` lets go after the lock (declared before it)
}

std::vector<Pager::Claim> Pager::claim_locked(PageId id) {
  std::vector<Claim> claims;
  const auto it = pages_.find(id);
  if (it->second.state == PageState::kOffloaded) {
    it->second.claimed = true;
    claims.push_back({id, it->second.bytes, {}});
  }
  std::size_t pages_ahead = ahead_pages_;
  std::size_t bytes_ahead = ahead_bytes_;
  std::size_t skipped = 0;
  for (auto earlier = std::make_reverse_iterator(it);
       earlier != pages_.rend() && skipped < kMaxSkippedPages; ++earlier) {
    Page& page = earlier->second;
    if (page.state != PageState::kOffloaded || page.claimed) {
      ++skipped;
      continue;
    }
    if (!policy_->admits(pages_ahead, bytes_ahead, page.bytes)) break;
    page.claimed = true;
    claims.push_back({earlier->first, page.bytes, {}});
    ++pages_ahead;
    bytes_ahead += page.bytes;
  }
  return claims;
}

void Pager::allocate_claims(std::vector<Claim>& claims, bool needed, Stream stream) {
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

void Pager::unclaim(std::vector<Claim>& claims) {
  {
    std::lock_guard lock(mutex_);
    for (const Claim& claim : claims) {
      const auto it = pages_.find(claim.id);
      if (it != pages_.end()) it->second.claimed = false;
    }
  }
  claims.clear();  // allocated buffers let go after the lock
}

void Pager::start_page_ins_locked(std::vector<Claim>& claims, PageId needed,
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
    const auto it = pages_.find(claim.id);
    if (it == pages_.end()) {  // dropped while claimed
      if (claim.device.data != nullptr) released.push_back(std::move(claim.device));
      continue;
    }
    Page& page = it->second;
    page.claimed = false;
    if (claim.device.data == nullptr) continue;  // not allocated: stays offloaded
    page.transfer = engine_.copy(kToDevice, claim.device.data, page.host, page.bytes, after);
    pool_.record_stream(page.host, engine_.stream(kToDevice));  // its host block: freed once used
    page.device = std::move(claim.device);
    page.state = PageState::kPagingIn;
    ++ahead_pages_;
    ahead_bytes_ += page.bytes;
    ++stats_.num_page_ins;
    stats_.bytes_paged_in += as_signed(page.bytes);
    if (claim.id != needed) ++stats_.num_prefetched;
  }
  if (any) engine_.recycle_event(allocated);
}

void Pager::wait_for_locked(Page& page, ComputeTimeline& compute) {
  const Event arrival = engine_.borrow_event();
  try {
    compute.wait(page.transfer->finished(), arrival,
                 {"a saved tensor's copy back to the device",
                  engine_.bytes_in_flight(TransferDirection::kToDevice, page.transfer.get())});
  } catch (...) {  // interrupted or past its deadline: the page stays paging in, as it was
    engine_.recycle_event(arrival);
    throw;
  }
  pending_uses_.push_back({arrival, page.transfer});
  page.transfer.reset();
  release_host_locked(page);  // reused once the copy back has completed (stream-ordered)
  page.state = PageState::kResident;
  --ahead_pages_;
  ahead_bytes_ -= page.bytes;
}

void Pager::observe_use_locked(double lateness) {
  if (lateness > 0) {
    ++stats_.num_stalls;
    stats_.stall_ns += static_cast<std::int64_t>(lateness * 1e9);
  }
  policy_->observe(lateness, engine_.stats().bandwidth(kToDevice));
}

void Pager::measure_uses_locked() {
  while (!pending_uses_.empty()) {
    const PendingUse& use = pending_uses_.front();
    const std::optional<double> lateness = engine_.seconds_after(use.arrival, use.transfer);
    if (!lateness.has_value()) return;
    engine_.recycle_event(use.arrival);
    pending_uses_.pop_front();
    observe_use_locked(*lateness);
  }
}

void Pager::poll() {
  std::vector<DeviceBuffer> released;
  std::lock_guard lock(mutex_);
  poll_locked(released);
}

void Pager::poll_locked(std::vector<DeviceBuffer>& released) {
  while (!paging_out_.empty()) {
    const auto it = pages_.find(paging_out_.front());
    if (it == pages_.end() || it->second.state != PageState::kPagingOut) {
      paging_out_.pop_front();  // dropped or used since
      continue;
    }
    if (!engine_.done(it->second.transfer)) break;  // copies complete in order
    set_offloaded_locked(it->second, released);
    paging_out_.pop_front();
  }
  std::erase_if(parked_, [&](Parked& parked) {
    if (!engine_.done(parked.transfer)) return false;
    released.push_back(std::move(parked.device));
    return true;
  });
  measure_uses_locked();
}

void Pager::synchronize() {
  engine_.synchronize("the pager's copies at the end of the step");
  poll();
}

std::size_t Pager::relieve_pressure(std::size_t bytes, Stream) noexcept {
  std::vector<DeviceBuffer> released;
  std::size_t freed = 0;
  try {
    std::lock_guard lock(mutex_);
    poll_locked(released);
    for (const DeviceBuffer& buffer : released) freed += buffer.bytes;
    while (freed < bytes && !paging_out_.empty()) {
      const auto it = pages_.find(paging_out_.front());
      if (it != pages_.end() && it->second.state == PageState::kPagingOut) {
        engine_.wait(it->second.transfer, "a tensor's copy to host memory, to free its device memory");
        ++stats_.num_pressure_waits;
        freed += it->second.bytes;
        set_offloaded_locked(it->second, released);
      }
      paging_out_.pop_front();
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
    log_warning(detail::concat("the pager could not relieve memory pressure: ", error.what()));
  }
  released.clear();  // frees the device memory, without the pager's lock
  return freed;
}

void Pager::drop(PageId id) noexcept {
  std::vector<DeviceBuffer> released;
  std::lock_guard lock(mutex_);
  const auto it = pages_.find(id);
  if (it == pages_.end()) return;
  forget_locked(it->second, released);
  pages_.erase(it);
}

void Pager::set_offloaded_locked(Page& page, std::vector<DeviceBuffer>& released) {
  released.push_back(std::move(page.device));
  page.device = {};
  page.transfer.reset();
  page.state = PageState::kOffloaded;
}

void Pager::release_host_locked(Page& page) {
  pool_.free(page.host);
  page.host = nullptr;
  stats_.offloaded_bytes.update(-as_signed(page.bytes));
}

// The pages coming back ahead of use, furthest from use first (the lowest ids: pages come back
// in the reverse of their page-out order), until `bytes` are let go: each waits for its copy,
// gives its device buffer back and is offloaded again, its host block still holding the bytes.
std::size_t Pager::let_go_of_prefetches_locked(std::size_t bytes, std::vector<DeviceBuffer>& released) {
  std::size_t freed = 0;
  for (auto it = pages_.begin(); it != pages_.end() && freed < bytes && ahead_pages_ > 0; ++it) {
    Page& page = it->second;
    if (page.state != PageState::kPagingIn) continue;
    engine_.wait(page.transfer, "a tensor's copy back to the device, to let go of it");
    ++stats_.num_prefetches_let_go;
    freed += page.bytes;
    --ahead_pages_;
    ahead_bytes_ -= page.bytes;
    set_offloaded_locked(page, released);
  }
  return freed;
}

void Pager::forget_locked(Page& page, std::vector<DeviceBuffer>& released) {
  switch (page.state) {
    case PageState::kPagingOut:
      pool_.free(page.host);  // stream-ordered behind the copy that writes it
      stats_.offloaded_bytes.update(-as_signed(page.bytes));
      parked_.push_back({std::move(page.transfer), std::move(page.device)});
      break;
    case PageState::kOffloaded:
      pool_.free(page.host);
      stats_.offloaded_bytes.update(-as_signed(page.bytes));
      break;
    case PageState::kPagingIn:
      release_host_locked(page);
      parked_.push_back({std::move(page.transfer), std::move(page.device)});
      --ahead_pages_;
      ahead_bytes_ -= page.bytes;
      break;
    case PageState::kResident:
      if (page.transfer != nullptr && !engine_.done(page.transfer)) {
        parked_.push_back({std::move(page.transfer), std::move(page.device)});  // still read
      } else {
        released.push_back(std::move(page.device));
      }
      break;
  }
  page.host = nullptr;
  --stats_.pages;
}

PageState Pager::state(PageId id) const {
  std::lock_guard lock(mutex_);
  const auto it = pages_.find(id);
  STOWAGE_CHECK(it != pages_.end(), "page ", id, " is not in the pager");
  return it->second.state;
}

void Pager::set_prefetch_policy(std::unique_ptr<PrefetchPolicy> policy) {
  STOWAGE_CHECK(policy != nullptr, "a pager needs a prefetch policy");
  std::lock_guard lock(mutex_);
  policy_ = std::move(policy);
}

PagerStats Pager::stats() const {
  std::lock_guard lock(mutex_);
  PagerStats out = stats_;
  out.window_bytes = as_signed(policy_->window_bytes());
  return out;
}

void Pager::check_invariants() const {
  std::lock_guard lock(mutex_);
  std::size_t offloaded = 0;
  std::size_t ahead = 0;
  std::size_t ahead_bytes = 0;
  for (const auto& [id, page] : pages_) {
    const bool on_host = page.state != PageState::kResident;
    const bool copying = page.state == PageState::kPagingOut || page.state == PageState::kPagingIn;
    // A resident page may keep the page-out that still reads it (Note [Page states]).
    STOWAGE_INTERNAL_ASSERT(on_host == (page.host != nullptr), "page ", id, ": host block");
    STOWAGE_INTERNAL_ASSERT((page.state != PageState::kOffloaded) == (page.device.data != nullptr),
                            "page ", id, ": device buffer");
    STOWAGE_INTERNAL_ASSERT(
        page.state == PageState::kResident || copying == (page.transfer != nullptr), "page ", id,
        ": transfer");
    if (on_host) offloaded += page.bytes;
    if (page.state == PageState::kPagingIn) {
      ++ahead;
      ahead_bytes += page.bytes;
    }
  }
  STOWAGE_INTERNAL_ASSERT(as_signed(offloaded) == stats_.offloaded_bytes.current,
                          "offloaded bytes ", offloaded, " vs ", stats_.offloaded_bytes.current);
  STOWAGE_INTERNAL_ASSERT(as_signed(pages_.size()) == stats_.pages, "page count");
  STOWAGE_INTERNAL_ASSERT(ahead == ahead_pages_ && ahead_bytes == ahead_bytes_, "pages ahead");
}

}  // namespace stowage
