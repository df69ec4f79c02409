#include "allocator/stats.hpp"

#include <algorithm>

namespace stowage {

namespace {

template <typename Fn>
void for_each_stat(DeviceStats& stats, Fn&& fn) {
  for (SizeClassStats* by_class :
       {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split,
        &stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
        &stats.inactive_split_bytes, &stats.requested_bytes}) {
    for (Stat& stat : by_class->stats) fn(stat);
  }
  fn(stats.oversize_allocations);
  fn(stats.oversize_segments);
  fn(stats.mapped_pages);
}

void add_stat(std::vector<std::pair<std::string, std::int64_t>>& out, const std::string& prefix,
              const Stat& stat) {
  out.emplace_back(prefix + ".current", stat.current);
  out.emplace_back(prefix + ".peak", stat.peak);
  out.emplace_back(prefix + ".allocated", stat.allocated);
  out.emplace_back(prefix + ".freed", stat.freed);
}

}  // namespace

void DeviceStats::reset_peak() noexcept {
  for_each_stat(*this, [](Stat& stat) { stat.reset_peak(); });
}

void DeviceStats::reset_accumulated() noexcept {
  for_each_stat(*this, [](Stat& stat) { stat.reset_accumulated(); });
  num_alloc_retries = 0;
  num_ooms = 0;
  num_sync_all_streams = 0;
  num_device_alloc = 0;
  num_device_free = 0;
  num_invalid_frees = 0;
  num_maps = 0;
  num_unmaps = 0;
  num_device_calls = 0;
  device_call_ns = 0;
}

std::vector<std::pair<std::string, std::int64_t>> memory_stats_entries(const DeviceStats& stats) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  const std::pair<const char*, const SizeClassStats*> classed[] = {
      {"allocation", &stats.allocation},
      {"segment", &stats.segment},
      {"active", &stats.active},
      {"inactive_split", &stats.inactive_split},
      {"allocated_bytes", &stats.allocated_bytes},
      {"reserved_bytes", &stats.reserved_bytes},
      {"active_bytes", &stats.active_bytes},
      {"inactive_split_bytes", &stats.inactive_split_bytes},
      {"requested_bytes", &stats.requested_bytes},
  };
  for (const auto& [name, by_class] : classed) {
    const std::string base(name);
    add_stat(out, base + ".all", by_class->stats[0]);
    add_stat(out, base + ".small_pool", by_class->stats[1]);
    add_stat(out, base + ".large_pool", by_class->stats[2]);
  }
  add_stat(out, "oversize_allocations", stats.oversize_allocations);
  add_stat(out, "oversize_segments", stats.oversize_segments);
  add_stat(out, "mapped_pages", stats.mapped_pages);
  out.emplace_back("num_maps", stats.num_maps);
  out.emplace_back("num_unmaps", stats.num_unmaps);
  out.emplace_back("num_alloc_retries", stats.num_alloc_retries);
  out.emplace_back("num_ooms", stats.num_ooms);
  out.emplace_back("num_sync_all_streams", stats.num_sync_all_streams);
  out.emplace_back("num_device_alloc", stats.num_device_alloc);
  out.emplace_back("num_device_free", stats.num_device_free);
  out.emplace_back("num_invalid_frees", stats.num_invalid_frees);
  out.emplace_back("num_device_calls", stats.num_device_calls);
  out.emplace_back("device_call_ns", stats.device_call_ns);
  out.emplace_back("num_steps", stats.num_steps);
  out.emplace_back("last_step.num_maps", stats.last_step.maps);
  out.emplace_back("last_step.num_unmaps", stats.last_step.unmaps);
  out.emplace_back("last_step.num_device_calls", stats.last_step.device_calls);
  out.emplace_back("last_step.device_call_ns", stats.last_step.device_call_ns);
  out.emplace_back("max_split_size", stats.max_split_size);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace stowage
