// `stowage replay`'s table: one row of text cells per replayed device trace, and the notes printed
// under it (what learned placement did; why a native figure is starred). The printer only lays them
// out.
//
// Contract: a pure function, no state. Byte counts are whole MiB with thousands commas ("1,550"),
// each reserved figure followed by its ratio to the row's peak of requested bytes ("1,598 (1.031x)");
// a figure the row does not have reads "-". The cells are as Python formats the same numbers
// (round half to even on the exact binary value), so the table reads as it did when Python made it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stowage {

// What one row shows: stowage.replay.replay_snapshot's result for one device trace.
struct ReplayTableRow {
  std::string trace;  // the snapshot's path
  std::int64_t device = 0;
  std::uint64_t events = 0, skipped_frees = 0, peak_requested = 0, peak_reserved = 0;
  std::optional<std::uint64_t> min_capacity;          // none: not searched
  std::optional<std::uint64_t> native_peak_reserved;  // none: the snapshot does not say
  bool native_comparable = false;
  std::uint64_t maps = 0, unmaps = 0, steps = 0;
  std::uint64_t steps_after_warmup = 0, device_calls_after_warmup = 0;
  double worst_step_ms = 0;  // of the steps after the warm-up
  double ns_per_call_p50 = 0, ns_per_call_p99 = 0;
  std::optional<double> events_per_second;  // none: the replay took no measurable time
  bool oom = false;
  std::uint64_t layouts_made = 0, departures = 0, placed_allocations = 0, arena_bytes = 0, layout_live_bytes = 0;
};

struct ReplayTable {
  std::vector<std::string> columns;  // the first ("trace") left-justified, the others right
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> notes;  // lines under the table
};

ReplayTable replay_table(const std::vector<ReplayTableRow>& rows);

}  // namespace stowage
