#include "allocator/replay_table.hpp"

#include <cmath>

#include "base/byte_units.hpp"
#include "base/fixed_point.hpp"

namespace stowage {

namespace {

// Whole MiB with thousands commas, as f"{value / 2**20:,.0f}" (nearbyint: half to even, as Python).
std::string mib(std::optional<std::uint64_t> value) {
  if (!value) return "-";
  return with_commas(static_cast<std::uint64_t>(std::nearbyint(static_cast<double>(*value) / static_cast<double>(kMiB))));
}

// " (1.031x)": `value` over the row's peak of requested bytes; nothing without either.
std::string ratio(std::optional<std::uint64_t> value, std::uint64_t base) {
  if (!value || base == 0) return "";
  return " (" + fixed_point(static_cast<double>(*value) / static_cast<double>(base), 3) + "x)";
}

std::string file_name(const std::string& path) {
  std::string name = path;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  const std::size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

std::string calls_once_warm(const ReplayTableRow& row) {
  if (row.steps_after_warmup == 0) return "-";
  const std::string calls = with_commas(row.device_calls_after_warmup);
  return row.device_calls_after_warmup == 0 ? calls : calls + " (" + fixed_point(row.worst_step_ms, 1) + " ms)";
}

bool native_starred(const ReplayTableRow& row) { return row.native_peak_reserved && !row.native_comparable; }

std::vector<std::string> cells(const ReplayTableRow& row) {
  const std::string name = file_name(row.trace);
  return {name.substr(0, name.find(".pickle")),
          std::to_string(row.device),
          with_commas(row.events),
          with_commas(row.skipped_frees),
          mib(row.peak_requested),
          mib(row.peak_reserved) + ratio(row.peak_reserved, row.peak_requested),
          mib(row.min_capacity) + ratio(row.min_capacity, row.peak_requested),
          mib(row.native_peak_reserved) + ratio(row.native_peak_reserved, row.peak_requested) +
              (native_starred(row) ? " *" : ""),
          with_commas(row.maps) + "/" + with_commas(row.unmaps),
          std::to_string(row.steps),
          calls_once_warm(row),
          fixed_point(row.ns_per_call_p50, 0) + "/" + fixed_point(row.ns_per_call_p99, 0),
          row.events_per_second ? fixed_point(*row.events_per_second / 1e6, 1) : "-",
          row.oom ? "yes" : "no"};
}

}  // namespace

ReplayTable replay_table(const std::vector<ReplayTableRow>& rows) {
  ReplayTable table{{"trace", "dev", "events", "skipped frees", "peak requested", "stowage reserved", "min capacity",
                     "native reserved", "maps/unmaps", "steps", "calls once warm", "p50/p99 ns", "M events/s", "oom"},
                    {},
                    {}};
  bool starred = false;
  for (const ReplayTableRow& row : rows) {
    table.rows.push_back(cells(row));
    starred = starred || native_starred(row);
  }
  for (const ReplayTableRow& row : rows) {
    if (row.layouts_made == 0 && row.departures == 0) continue;
    const std::string arena = row.arena_bytes == 0 ? ""
                                                    : "; the layout in force packs " + mib(row.layout_live_bytes) +
                                                          " MiB live into " + mib(row.arena_bytes) + " MiB";
    table.notes.push_back(file_name(row.trace) + ": learned placement made " + std::to_string(row.layouts_made) +
                          " step layout(s), left " + std::to_string(row.departures) + ", placed " +
                          with_commas(row.placed_allocations) + " request(s)" + arena + ".");
  }
  if (starred) {
    table.notes.emplace_back(
        "* the trace's allocations reused memory cached before it began: the native figure is not comparable with "
        "a replay from empty.");
  }
  return table;
}

}  // namespace stowage
