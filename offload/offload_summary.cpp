#include "offload/offload_summary.hpp"

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/fixed_point.hpp"

namespace stowage::offload {

namespace {

std::int64_t value(const std::map<std::string, std::int64_t>& stats, const std::string& key) {
  const auto found = stats.find(key);
  STOWAGE_CHECK(found != stats.end(), "the offload statistics have no '", key, "'");
  return found->second;
}

std::string bytes(const std::map<std::string, std::int64_t>& stats, const std::string& key) {
  const std::int64_t count = value(stats, key);
  STOWAGE_CHECK(count >= 0, "the offload statistic '", key, "' is negative: ", count);
  return format_bytes(static_cast<std::size_t>(count));
}

// A copy rate in bytes a second; "-" before any copy was timed.
std::string rate(const std::map<std::string, std::int64_t>& stats, const std::string& key) {
  return value(stats, key) != 0 ? bytes(stats, key) + "/s" : "-";
}

}  // namespace

std::vector<std::string> offload_summary_lines(const std::map<std::string, std::int64_t>& stats) {
  const auto offloads = stats.find("offload.num_offloads");
  if (offloads == stats.end() || offloads->second == 0) return {};
  const std::string stall_ms = fixed_point(static_cast<double>(value(stats, "offload.stall_ns")) / 1e6, 1);
  const auto count = [&stats](const std::string& key) { return std::to_string(value(stats, key)); };
  return {
      "Offloaded: " + bytes(stats, "offload.offloaded_bytes.current") + " now, " +
          bytes(stats, "offload.offloaded_bytes.peak") + " at most",
      "Pinned host memory: " + bytes(stats, "offload.pinned.reserved_bytes.current") + " (peak " +
          bytes(stats, "offload.pinned.reserved_bytes.peak") + ", " + count("offload.pinned.num_pinnings") +
          " pinnings, pageable " + bytes(stats, "offload.pinned.pageable_bytes") + ")",
      "Offloaded " + bytes(stats, "offload.bytes_offloaded") + " at " + rate(stats, "offload.to_host.bytes_per_second") +
          ", reloaded " + bytes(stats, "offload.bytes_reloaded") + " at " +
          rate(stats, "offload.to_device.bytes_per_second"),
      "Stalls: " + count("offload.num_stalls") + ", " + stall_ms + " ms; prefetched " +
          count("offload.num_prefetched") + "; syncs " + count("offload.num_syncs"),
  };
}

}  // namespace stowage::offload
