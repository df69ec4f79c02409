// Offloader: the table of offloaded device buffers, their copies to pinned host memory and back,
// the prefetch queue, and the allocator's pressure handler.
//
// Note [Offload states]
// The offloader's unit is one device buffer (in the torch layer: a tensor's storage) that it moved
// or is moving to host memory; `offload` returns its id. Its states:
//   offloading  the copy to a host block runs; the offloader holds the device buffer, so its
//               memory cannot be reused while the copy reads it, and lets go when the copy
//               completes (poll) or when the allocator runs short (relieve_pressure waits for it);
//   offloaded   only the host block holds the bytes;
//   reloading   a new device buffer was allocated on the compute stream and the copy back runs
//               or ran, and no reload has asked for it yet (it came back ahead of use); the host
//               block still holds the bytes, so under pressure the offloader can let go of the
//               device buffer (once the copy completes) and the buffer is offloaded again: what
//               comes back ahead of use never holds memory a request needs;
//   resident    back on the device: reload returned it and keeps returning it until drop();
//               its host block went back to the pool, to be reused once the copy back completes.
// A reload while the buffer is still offloading returns the device buffer it still holds: no
// copy, no wait (forward's last buffers are backward's first); the entry keeps the copy, which
// still reads the buffer, until it completes. Dropping a buffer whose copy runs parks the device
// buffer until the copy completes, so a freed tensor never frees memory a copy still uses, and its
// host block goes back stream-ordered.
//
// Ordering: an offload's copy follows the compute that produced the buffer (an event on the
// compute timeline); a reload's copy follows the compute that allocated its destination, and
// the compute that uses it waits for the copy (a stream wait on a GPU: the host never blocks).
// Buffers come back in the reverse of their offload order, ahead of use as far as the prefetch
// policy admits (Note [Prefetch window]) and only into memory free without eviction.
//
// Measuring: every reload marks on the compute the moment it got there. Once the marks and the
// copies have completed, each use gives the policy its lateness (a stall, or slack) and joins
// the pass's record: its copy bytes and the compute from it to the next use (the time between
// the two marks less the stall). A pass is a backward: the reloads from the first after an
// offload to the next offload; it goes to the policy when the next pass's first use is measured,
// or at synchronize() when nothing is left to measure (Note [Reload simulation]).
//
// Contract: thread-safe. Device memory is allocated and device buffers are let go without the
// offloader's lock, so allocating may call relieve_pressure on the same thread. The engine and
// the pool must outlive the offloader; buffers still held when it is destroyed are dropped after
// their copies complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "allocator/memory_pressure.hpp"
#include "allocator/stats.hpp"
#include "offload/compute_timeline.hpp"
#include "offload/pinned_host_pool.hpp"
#include "offload/prefetch_policy.hpp"
#include "offload/transfer_engine.hpp"

namespace stowage {

// Device memory and what keeps it alive: letting go of `owner` frees it (through whatever
// allocator made it; in the torch layer, a storage).
struct DeviceBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  std::shared_ptr<void> owner;
};

// Allocates device memory usable by the compute on `stream`. Throws when there is none (the
// allocator's out-of-memory error reaches the caller of reload).
using DeviceAllocate = std::function<DeviceBuffer(std::size_t bytes, Stream stream)>;
// The bytes that can be allocated now without eviction or failure (for prefetching).
using DeviceRoom = std::function<std::size_t()>;

enum class OffloadState : std::uint8_t { kOffloading, kOffloaded, kReloading, kResident };

struct OffloaderStats {
  Stat offloaded_bytes;  // bytes whose copy is in host memory (all but resident buffers)
  std::int64_t buffers = 0;
  std::int64_t num_offloads = 0;
  std::int64_t bytes_offloaded = 0;
  std::int64_t num_reloads = 0;     // copies back to the device
  std::int64_t bytes_reloaded = 0;
  std::int64_t num_prefetched = 0;   // of those, started before the buffer was asked for
  std::int64_t num_still_resident = 0;  // used from the device before its copy was let go of
  std::int64_t num_host_full = 0;    // offload refused: no host memory
  std::int64_t num_stalls = 0;       // uses that waited for their copy
  std::int64_t stall_ns = 0;         // how long they waited (measured on the device on a GPU)
  std::int64_t num_pressure_waits = 0;  // copies waited for to free device memory
  std::int64_t pressure_bytes = 0;      // device bytes let go to relieve pressure
  std::int64_t num_prefetches_let_go = 0;  // buffers back ahead of use offloaded again under pressure
  std::int64_t window_bytes = 0;        // the prefetch policy's window now
};

class Offloader final : public MemoryPressureHandler {
 public:
  using OffloadId = std::uint64_t;

  Offloader(TransferEngine& engine, PinnedHostPool& pool, DeviceAllocate allocate, DeviceRoom room,
            std::unique_ptr<PrefetchPolicy> policy);
  ~Offloader() override;
  Offloader(const Offloader&) = delete;
  Offloader& operator=(const Offloader&) = delete;

  // Starts copying `buffer` to host memory once the compute so far is done. nullopt when the
  // host has no memory for it: the caller keeps the buffer (nothing is lost).
  std::optional<OffloadId> offload(DeviceBuffer buffer, ComputeTimeline& compute);
  // The buffer's bytes on the device, usable by compute enqueued after this returns; starts
  // bringing back the buffers before it (Note [Prefetch window]). Throws the allocator's error
  // when the device has no memory for it; the buffer stays offloaded then.
  DeviceBuffer reload(OffloadId id, ComputeTimeline& compute);
  // The buffer is no longer needed (its tensor was freed). Unknown ids are ignored.
  void drop(OffloadId id) noexcept;
  // The buffer's bytes were used where they are, its storage still on the device (its copy about
  // to be dropped): counted as still resident when its offload had not been let go of yet.
  void note_used_in_place(OffloadId id) noexcept;
  OffloadState state(OffloadId id) const;

  // Lets go of device buffers whose offloads completed and of parked buffers whose copies
  // completed; takes the stall measurements that completed. Never blocks.
  void poll();
  // Waits for every copy (the engine counts it), then polls.
  void synchronize();
  // MemoryPressureHandler: waits for the oldest offloads until `bytes` of device memory are let
  // go (or none is left), and for parked copies; then, short of `bytes`, lets go of buffers that
  // came back ahead of use (furthest from use first), which are offloaded again.
  std::size_t relieve_pressure(std::size_t bytes, Stream stream) noexcept override;

  // Replaces the prefetch policy (Note [Prefetch window]) for the reloads from now on.
  void set_prefetch_policy(std::unique_ptr<PrefetchPolicy> policy);

  OffloaderStats stats() const;
  // Throws InternalError if the table and the statistics disagree.
  void check_invariants() const;

 private:
  struct Entry {
    OffloadState state = OffloadState::kOffloading;
    std::size_t bytes = 0;
    void* host = nullptr;    // all but resident
    DeviceBuffer device;     // offloading (the source), reloading, resident
    // The copy of the current state (offloading, reloading); a resident buffer that was still
    // offloading keeps that copy, which may still read its buffer.
    TransferHandle transfer;
    bool claimed = false;    // a reload is allocating its device buffer
  };
  // A device buffer let go once its copy completes.
  struct Parked {
    TransferHandle transfer;
    DeviceBuffer device;
  };
  // A use, measured once its events complete (see Measuring above).
  struct PendingUse {
    Event arrival;
    TransferHandle transfer;      // the copy the use waited for; null when it waited for none
    std::size_t copy_bytes = 0;   // that copy's bytes
    std::uint64_t pass = 0;
  };
  struct Claim {
    OffloadId id = 0;
    std::size_t bytes = 0;
    DeviceBuffer device;
  };

  // The buffers to bring back now, claimed: `id` when offloaded, then those before it the policy
  // admits. Under the lock.
  std::vector<Claim> claim_locked(OffloadId id);
  // Allocates the claims' device buffers, the first (the buffer needed now, when `needed`) or
  // not at all; stops at the first prefetch that does not fit. Without the lock.
  void allocate_claims(std::vector<Claim>& claims, bool needed, Stream stream);
  // Starts the copies back for the allocated claims and un-claims the rest; the device buffers of
  // entries dropped meanwhile go to `released`. Under the lock.
  void start_reloads_locked(std::vector<Claim>& claims, OffloadId needed, ComputeTimeline& compute,
                            std::vector<DeviceBuffer>& released);
  // Un-claims every claim (an allocation failed) and releases what was allocated.
  void unclaim(std::vector<Claim>& claims);
  // Makes the compute wait for `entry`'s copy back, or (resident) marks where it got to; either
  // is measured as a use.
  void use_locked(Entry& entry, ComputeTimeline& compute);
  void poll_locked(std::vector<DeviceBuffer>& released);
  void measure_uses_locked();
  void observe_use_locked(double lateness);
  // Hands the measured pass to the policy and starts the next.
  void end_pass_locked();
  void set_offloaded_locked(Entry& entry, std::vector<DeviceBuffer>& released);
  void forget_locked(Entry& entry, std::vector<DeviceBuffer>& released);
  void release_host_locked(Entry& entry);
  std::size_t let_go_of_prefetches_locked(std::size_t bytes, std::vector<DeviceBuffer>& released);

  TransferEngine& engine_;
  PinnedHostPool& pool_;
  const DeviceAllocate allocate_;
  const DeviceRoom room_;

  mutable std::mutex mutex_;  // guards everything below
  std::unique_ptr<PrefetchPolicy> policy_;
  std::map<OffloadId, Entry> entries_;
  std::deque<OffloadId> offloading_;  // in copy order; ids of buffers no longer offloading are skipped
  std::size_t ahead_buffers_ = 0;    // buffers reloading that no reload has asked for yet
  std::size_t ahead_bytes_ = 0;
  std::vector<Parked> parked_;
  std::deque<PendingUse> pending_uses_;
  std::uint64_t pass_ = 0;              // the pass reloads belong to now
  bool reloaded_since_offload_ = false;  // the next offload starts a pass
  std::uint64_t measured_pass_ = 0;     // the pass of pass_uses_
  std::vector<ReloadUse> pass_uses_;    // its uses measured so far
  std::optional<Event> last_arrival_;   // the last measured use's mark (for the compute after it)
  double last_stall_ = 0;               // and its stall
  OffloadId next_id_ = 1;
  OffloaderStats stats_;
};

}  // namespace stowage
