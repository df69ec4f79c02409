// OffloadEngine: one device's offload machinery, composed: the pinned host pool, the transfer
// engine and the offloader over them, registered as its device allocator's pressure handler.
//
// The torch layer makes one per device it offloads from (python/tensors/offload_engines.hpp) and
// reads its statistics into stowage.memory_stats() under "offload." keys.
//
// Contract: thread-safe (its parts are). The backend and the allocator must outlive it; it
// removes its pressure handler when destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "offload/offloader.hpp"
#include "offload/pinned_host_pool.hpp"
#include "offload/prefetch_policy.hpp"
#include "offload/transfer_engine.hpp"

namespace stowage {

struct OffloadEngineOptions {
  PinnedHostPoolOptions pool;
  // Buffers ahead of use: nullopt chooses the window from measurements (Note [Prefetch window]),
  // up to max_prefetch_bytes.
  std::optional<std::size_t> prefetch_depth;
  std::size_t max_prefetch_bytes = std::size_t{1} << 30;
};

// The policy the options ask for (Note [Prefetch window]).
std::unique_ptr<PrefetchPolicy> make_prefetch_policy(const OffloadEngineOptions& options);

struct OffloadStats {
  OffloaderStats offloader;
  TransferStats transfers;
  PinnedHostPoolStats pool;
};

class OffloadEngine {
 public:
  // `allocator` (nullable) is the device's stowage allocator: the offloader relieves its pressure.
  OffloadEngine(DeviceBackend& backend, CachingAllocator* allocator, DeviceAllocate allocate,
                DeviceRoom room, const OffloadEngineOptions& options);
  ~OffloadEngine();
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  Offloader& offloader() noexcept { return *offloader_; }
  TransferEngine& transfers() noexcept { return transfers_; }
  PinnedHostPool& pool() noexcept { return pool_; }
  DeviceBackend& backend() noexcept { return backend_; }

  // Between steps: waits for the copies, lets go of what they held, and settles the pinned pool
  // (Note [One pinned arena]).
  void end_step();
  OffloadStats stats();

 private:
  DeviceBackend& backend_;
  CachingAllocator* allocator_;
  PinnedHostPool pool_;
  TransferEngine transfers_;
  std::unique_ptr<Offloader> offloader_;
};

// The statistics as stowage.memory_stats() lists them: "offload.offloaded_bytes.current", ...
// The copies' counts and bytes ("offload.to_host.bytes", ...) are every copy on the engine's
// streams: the activations' buffers and the offloaded optimizer's gradients and parameters.
std::vector<std::pair<std::string, std::int64_t>> offload_stats_entries(const OffloadStats& stats);

}  // namespace stowage
