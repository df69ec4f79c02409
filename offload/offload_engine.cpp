#include "offload/offload_engine.hpp"

#include <cmath>

namespace stowage {

std::unique_ptr<PrefetchPolicy> make_prefetch_policy(const OffloadEngineOptions& options) {
  if (options.prefetch_depth.has_value()) {
    return std::make_unique<FixedPrefetch>(*options.prefetch_depth);
  }
  return std::make_unique<MeasuredPrefetch>(options.max_prefetch_bytes);
}

OffloadEngine::OffloadEngine(DeviceBackend& backend, CachingAllocator* allocator,
                             DeviceAllocate allocate, DeviceRoom room,
                             const OffloadEngineOptions& options)
    : backend_(backend),
      allocator_(allocator),
      pool_(backend, options.pool),
      transfers_(backend),
      offloader_(std::make_unique<Offloader>(transfers_, pool_, std::move(allocate), std::move(room),
                                             make_prefetch_policy(options))) {
  if (allocator_ != nullptr) allocator_->add_pressure_handler(offloader_.get());
}

OffloadEngine::~OffloadEngine() {
  if (allocator_ != nullptr) allocator_->remove_pressure_handler(offloader_.get());
  offloader_.reset();  // before the engine and the pool it uses
}

void OffloadEngine::end_step() {
  offloader_->synchronize();
  pool_.settle(transfers_.stream(TransferDirection::kToHost));
}

OffloadStats OffloadEngine::stats() {
  return {offloader_->stats(), transfers_.stats(), pool_.stats()};
}

std::vector<std::pair<std::string, std::int64_t>> offload_stats_entries(const OffloadStats& stats) {
  const OffloaderStats& p = stats.offloader;
  const TransferStats& t = stats.transfers;
  const PinnedHostPoolStats& pool = stats.pool;
  const auto rate = [&](TransferDirection direction) {
    return static_cast<std::int64_t>(std::llround(t.bandwidth(direction)));
  };
  std::vector<std::pair<std::string, std::int64_t>> out = {
      {"offload.offloaded_bytes.current", p.offloaded_bytes.current},
      {"offload.offloaded_bytes.peak", p.offloaded_bytes.peak},
      {"offload.buffers", p.buffers},
      {"offload.num_offloads", p.num_offloads},
      {"offload.bytes_offloaded", p.bytes_offloaded},
      {"offload.num_reloads", p.num_reloads},
      {"offload.bytes_reloaded", p.bytes_reloaded},
      {"offload.num_prefetched", p.num_prefetched},
      {"offload.num_still_resident", p.num_still_resident},
      {"offload.num_host_full", p.num_host_full},
      {"offload.num_stalls", p.num_stalls},
      {"offload.stall_ns", p.stall_ns},
      {"offload.num_pressure_waits", p.num_pressure_waits},
      {"offload.pressure_bytes", p.pressure_bytes},
      {"offload.num_prefetches_let_go", p.num_prefetches_let_go},
      {"offload.prefetch_window_bytes", p.window_bytes},
      {"offload.to_host.num_copies", t.num_to_host},
      {"offload.to_host.bytes", t.bytes_to_host},
      {"offload.to_host.busy_ns", t.busy_ns_to_host},
      {"offload.to_host.bytes_per_second", rate(TransferDirection::kToHost)},
      {"offload.to_device.num_copies", t.num_to_device},
      {"offload.to_device.bytes", t.bytes_to_device},
      {"offload.to_device.busy_ns", t.busy_ns_to_device},
      {"offload.to_device.bytes_per_second", rate(TransferDirection::kToDevice)},
      {"offload.num_syncs", t.num_syncs + pool.num_syncs},
      {"offload.pinned.reserved_bytes.current", pool.reserved_bytes},
      {"offload.pinned.reserved_bytes.peak", pool.peak_reserved_bytes},
      {"offload.pinned.allocated_bytes.current", pool.allocated_bytes},
      {"offload.pinned.allocated_bytes.peak", pool.peak_allocated_bytes},
      {"offload.pinned.pinned_bytes", static_cast<std::int64_t>(pool.segments.pinned_bytes)},
      {"offload.pinned.pageable_bytes", static_cast<std::int64_t>(pool.segments.pageable_bytes)},
      {"offload.pinned.num_pinnings", pool.segments.num_pinnings},
      {"offload.pinned.pinning_refused", pool.segments.pinning_refused ? 1 : 0},
      {"offload.pinned.num_settles", pool.num_settles},
  };
  return out;
}

}  // namespace stowage
