#include "snapshot/diff_report.hpp"

#include <cstdint>
#include <cmath>

#include "base/byte_units.hpp"
#include "base/fixed_point.hpp"
#include "snapshot/findings_rows.hpp"

namespace stowage::snapshot {

namespace {

std::string bytes(std::optional<Wide> value) { return value ? bytes_text(*value) : "-"; }

std::string signed_bytes(Wide value) {
  std::string out = value > 0 ? "+" : "";
  return out.append(bytes_text(value));
}

// As Python's f"0x{value:x}", all 128 bits.
std::string address_text(Wide value) {
  std::string digits;
  for (Wide rest = value < 0 ? -value : value; digits.empty() || rest > 0; rest /= 16) {
    digits.push_back("0123456789abcdef"[static_cast<int>(rest % 16)]);
  }
  std::string out = value < 0 ? "0x-" : "0x";
  return out.append(digits.rbegin(), digits.rend());
}

// As printf's "%+.1f points": a sign always (a negative zero's own).
std::string signed_points(double value) {
  std::string text = fixed_point(value, 1);
  if (!std::signbit(value)) text.insert(0, 1, '+');
  return text.append(" points");
}

std::string signed_count(std::int64_t value) {
  const std::uint64_t magnitude = value < 0 ? 0 - static_cast<std::uint64_t>(value) : static_cast<std::uint64_t>(value);
  std::string out = value < 0 ? "-" : "+";
  return out.append(with_commas(magnitude));
}

TextTable totals_table(const SnapshotTotals& a, const SnapshotTotals& b) {
  TextTable table{"totals", {"", "before", "after", "change"}, {""}, {}};
  const auto add = [&table](const char* label, std::optional<Wide> before, std::optional<Wide> after) {
    if (!before && !after) return;
    table.rows.push_back({label, bytes(before), bytes(after),
                          before && after ? signed_bytes(*after - *before) : std::string("-")});
  };
  add("allocated", a.allocated, b.allocated);
  add("reserved", a.reserved, b.reserved);
  add("largest free block", a.largest_free_block, b.largest_free_block);
  add("live peak of the trace", a.trace_peak, b.trace_peak);
  table.rows.push_back({"segments", with_commas(static_cast<std::uint64_t>(a.segments)),
                        with_commas(static_cast<std::uint64_t>(b.segments)), signed_count(b.segments - a.segments)});
  table.rows.push_back({"fragmentation", fixed_point(100 * a.fragmentation, 1) + "%",
                        fixed_point(100 * b.fragmentation, 1) + "%",
                        signed_points(100 * (b.fragmentation - a.fragmentation))});
  return table;
}

TextTable sites_table(const char* title, const std::vector<SiteChange>& sites) {
  TextTable table{title, {"change", "before", "after", "site"}, {"site"}, {}};
  for (const SiteChange& site : sites) {
    table.rows.push_back({signed_bytes(site.change), bytes_text(site.before), bytes_text(site.after), site.site});
  }
  return table;
}

TextTable changed_table(const std::vector<SegmentChange>& changed) {
  TextTable table{"segments changed in place", {"address", "size", "live before", "live after", "change"}, {}, {}};
  for (const SegmentChange& segment : changed) {
    table.rows.push_back({address_text(segment.address),
                          segment.size_after == segment.size_before
                              ? bytes_text(segment.size_after)
                              : bytes_text(segment.size_before) + " -> " + bytes_text(segment.size_after),
                          bytes_text(segment.live_before), bytes_text(segment.live_after), signed_bytes(segment.live_change)});
  }
  return table;
}

}  // namespace

DiffReport diff_report(const SnapshotsDiff& diff) {
  DiffReport report{totals_table(diff.before, diff.after), {}, {}, std::nullopt};
  if (!diff.sites.grew.empty()) report.sites.push_back(sites_table("grew, by site", diff.sites.grew));
  if (!diff.sites.shrank.empty()) report.sites.push_back(sites_table("shrank, by site", diff.sites.shrank));
  const SegmentsDiff& segments = diff.segments;
  report.segments = "segments: " + with_commas(segments.only_before) + " given back (" +
                    bytes_text(segments.only_before_bytes) + "), " + with_commas(segments.only_after) + " new (" +
                    bytes_text(segments.only_after_bytes) + "), " + with_commas(segments.changed_count) +
                    " changed in place";
  if (!segments.changed.empty()) report.changed_segments = changed_table(segments.changed);
  return report;
}

}  // namespace stowage::snapshot
