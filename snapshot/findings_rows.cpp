#include "snapshot/findings_rows.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "base/byte_units.hpp"
#include "base/fixed_point.hpp"

namespace stowage::snapshot {

namespace {

// "12.5%", as Python's f"{100 * part / whole:.1f}%" (`whole` > 0).
std::string share(Wide part, Wide whole) {
  return fixed_point(static_cast<double>(100 * part) / static_cast<double>(whole), 1) + "%";
}

std::string count_text(std::int64_t value) {
  std::string out = value < 0 ? "-" : "";
  return out.append(with_commas(value < 0 ? 0 - static_cast<std::uint64_t>(value) : static_cast<std::uint64_t>(value)));
}

}  // namespace

std::string bytes_text(Wide value) {
  const Wide magnitude = value < 0 ? -value : value;
  std::string out = value < 0 ? "-" : "";
  if (magnitude <= static_cast<Wide>(std::numeric_limits<std::size_t>::max())) {
    return out.append(format_bytes(static_cast<std::size_t>(magnitude)));
  }
  std::string digits;
  for (Wide rest = magnitude; rest > 0; rest /= 10) digits.push_back(static_cast<char>('0' + static_cast<int>(rest % 10)));
  return out.append(digits.rbegin(), digits.rend()).append(" B");
}

TextRows site_rows(const std::vector<SiteLive>& sites, Wide total) {
  TextRows rows;
  for (const SiteLive& site : sites) {
    rows.push_back({bytes_text(site.bytes), total != 0 ? share(site.bytes, total) : "-", count_text(site.allocations),
                    site.site});
  }
  return rows;
}

TextRows category_rows(const Peak& peak, bool before_trace) {
  std::vector<std::pair<std::string, Wide>> categories = peak.categories;
  std::stable_sort(categories.begin(), categories.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  Wide traced = 0;
  for (const auto& category : categories) traced += category.second;
  if (before_trace && peak.live_bytes - traced > 0) {
    categories.emplace_back("(live before the trace began)", peak.live_bytes - traced);
  }
  const Wide whole = std::max<Wide>(peak.live_bytes, 1);
  TextRows rows;
  for (const auto& [name, bytes] : categories) rows.push_back({bytes_text(bytes), share(bytes, whole), name});
  return rows;
}

TextRows module_rows(const Peak& peak) {
  const Wide whole = std::max<Wide>(peak.live_bytes, 1);
  TextRows rows;
  for (const ModuleLive& row : peak.modules) {
    rows.push_back({bytes_text(row.bytes), share(row.bytes, whole),
                    row.module.empty() ? "(outside any module's forward)" : row.module});
  }
  return rows;
}

TextRows held_rows(const std::vector<HeldSegment>& held) {
  TextRows rows;
  for (const HeldSegment& segment : held) {
    rows.push_back({bytes_text(segment.segment_bytes), bytes_text(segment.live_bytes), bytes_text(segment.held_back),
                    segment.site});
  }
  return rows;
}

TextRows step_rows(const std::vector<Step>& steps) {
  TextRows rows;
  for (const Step& step : steps) {
    std::string events = count_text(step.first_event);
    rows.push_back({std::to_string(step.number), events.append("-").append(count_text(step.last_event)),
                    bytes_text(step.peak_bytes), bytes_text(step.end_bytes)});
  }
  return rows;
}

}  // namespace stowage::snapshot
