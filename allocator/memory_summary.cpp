#include "allocator/memory_summary.hpp"

#include <array>
#include <cstdio>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "base/byte_units.hpp"
#include "base/errors.hpp"

namespace stowage {

namespace {

constexpr int kWidth = 75;
constexpr std::array<const char*, 4> kFields{"current", "peak", "allocated", "freed"};

// Concatenated by appending: GCC 12 at -O3 warns falsely (-Wrestrict) on `"literal" + string`.
std::string joined(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view part : parts) {
    out.append(part);
  }
  return out;
}

std::int64_t floor_div(std::int64_t value, std::int64_t divisor) {
  const std::int64_t quotient = value / divisor;
  return (value % divisor != 0 && (value < 0) != (divisor < 0)) ? quotient - 1 : quotient;
}

std::int64_t at(const std::map<std::string, std::int64_t>& stats, const std::string& key) {
  const auto found = stats.find(key);
  if (found == stats.end()) {
    STOWAGE_THROW(LogicError, "memory_summary: the statistics have no '", key, "'");
  }
  return found->second;
}

std::string padded(std::int64_t value, int width) {
  std::array<char, 32> text{};
  std::snprintf(text.data(), text.size(), "%*lld", width, static_cast<long long>(value));
  return text.data();
}

// "  1234 MiB": the unit in which `reference` (the row's all-pools figure) stays under 768.
std::string format_size(std::int64_t size, std::int64_t reference) {
  constexpr std::array<const char*, 5> kUnits{"B  ", "KiB", "MiB", "GiB", "TiB"};
  for (std::size_t unit = 0;; ++unit) {
    if (reference < 768 * 1024 || unit + 1 == kUnits.size()) {
      return joined({padded(size, 6), " ", kUnits[unit]});
    }
    size = floor_div(size, 1024);
    reference = floor_div(reference, 1024);
  }
}

std::string format_count(std::int64_t count, std::int64_t reference) {
  constexpr std::array<const char*, 3> kUnits{" ", "K", "M"};
  for (std::size_t unit = 0;; ++unit) {
    if (reference < 750 * 1000 || unit + 1 == kUnits.size()) {
      return joined({padded(count, 7), " ", kUnits[unit], " "});
    }
    count = floor_div(count, 1000);
    reference = floor_div(reference, 1000);
  }
}

// Python's f"{text:^75}": the extra space of an odd remainder goes on the right.
std::string centred(const std::string& text) {
  if (text.size() >= kWidth) {
    return text;
  }
  const std::size_t left = (kWidth - text.size()) / 2;
  return std::string(left, ' ') + text + std::string(kWidth - text.size() - left, ' ');
}

std::string left_justified(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

// `text` cut at spaces into pieces of at most `width` characters, the pieces after the first
// indented by two (a word longer than the width is cut inside it).
std::vector<std::string> wrapped(const std::string& text, std::size_t width) {
  std::vector<std::string> pieces;
  std::string rest = text;
  std::string indent;
  while (indent.size() + rest.size() > width) {
    const std::size_t room = width - indent.size();
    std::size_t cut = rest.rfind(' ', room);
    if (cut == std::string::npos || cut == 0) cut = room;
    pieces.push_back(indent + rest.substr(0, cut));
    rest = rest.substr(rest[cut] == ' ' ? cut + 1 : cut);
    indent = "  ";
  }
  pieces.push_back(indent + rest);
  return pieces;
}

using Formatter = std::string (*)(std::int64_t, std::int64_t);

std::string row(const std::string& label, const std::array<std::int64_t, 4>& values,
                const std::array<std::int64_t, 4>& reference, Formatter format) {
  std::string cells;
  for (std::size_t i = 0; i < values.size(); ++i) {
    cells.append(i == 0 ? "" : " | ").append(format(values[i], reference[i]));
  }
  return joined({" ", left_justified(label, 21), " | ", cells, " "});
}

std::array<std::int64_t, 4> fields_of(const std::map<std::string, std::int64_t>& stats, const std::string& prefix) {
  std::array<std::int64_t, 4> values{};
  for (std::size_t i = 0; i < kFields.size(); ++i) {
    values[i] = at(stats, prefix + "." + kFields[i]);
  }
  return values;
}

void metric_rows(const std::map<std::string, std::int64_t>& stats, bool abbreviated, std::vector<std::string>& lines) {
  struct Metric {
    const char* key;
    const char* name;
    Formatter format;
  };
  constexpr std::array<Metric, 9> kMetrics{{{"allocated_bytes", "Allocated memory", format_size},
                                            {"active_bytes", "Active memory", format_size},
                                            {"requested_bytes", "Requested memory", format_size},
                                            {"reserved_bytes", "Reserved memory", format_size},
                                            {"inactive_split_bytes", "Non-releasable memory", format_size},
                                            {"allocation", "Allocations", format_count},
                                            {"active", "Active allocs", format_count},
                                            {"segment", "Reserved segments", format_count},
                                            {"inactive_split", "Non-releasable allocs", format_count}}};
  for (const Metric& metric : kMetrics) {
    lines.push_back(std::string(kWidth, '-'));
    const std::string key = metric.key;
    const auto reference = fields_of(stats, key + ".all");
    lines.push_back(row(metric.name, reference, reference, metric.format));
    if (!abbreviated) {
      lines.push_back(row("      from large pool", fields_of(stats, key + ".large_pool"), reference, metric.format));
      lines.push_back(row("      from small pool", fields_of(stats, key + ".small_pool"), reference, metric.format));
    }
  }
  for (const auto& [key, name] : {std::pair{"oversize_allocations", "Oversize allocations"},
                                  std::pair{"oversize_segments", "Oversize segments"}}) {
    lines.push_back(std::string(kWidth, '-'));
    const auto values = fields_of(stats, key);
    std::string cells;
    for (std::size_t i = 0; i < values.size(); ++i) {
      cells.append(i == 0 ? "" : " | ").append(format_count(values[i], values[i]));
    }
    lines.push_back(joined({" ", left_justified(name, 21), " | ", cells, " "}));
  }
}

}  // namespace

std::string memory_summary(const std::map<std::string, std::int64_t>& stats, const std::string& title,
                           bool abbreviated, const std::vector<std::string>& extra_lines) {
  std::vector<std::string> lines{std::string(kWidth, '='), centred(title), std::string(kWidth, '-')};
  const std::string counters = joined({"OOMs: ", left_justified(std::to_string(at(stats, "num_ooms")), 12),
                                      " |  device alloc retries: ", std::to_string(at(stats, "num_alloc_retries"))});
  lines.push_back(centred(counters));
  lines.push_back(std::string(kWidth, '='));
  lines.push_back("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
  metric_rows(stats, abbreviated, lines);
  lines.push_back(std::string(kWidth, '='));
  if (!extra_lines.empty()) {
    for (const std::string& line : extra_lines) {
      for (const std::string& piece : wrapped(line, 73)) lines.push_back(joined({" ", left_justified(piece, 73), " "}));
    }
    lines.push_back(std::string(kWidth, '='));
  }
  std::string out;
  for (const std::string& line : lines) {
    out.append("|").append(line).append("|\n");
  }
  return out;
}

std::string memory_summary_title(std::int64_t device, std::size_t capacity) {
  std::string title = "stowage memory summary, ";
  if (device < 0) return title.append("simulated device of ").append(format_bytes(capacity));
  return title.append("CUDA device ").append(std::to_string(device)).append(" (").append(format_bytes(capacity)).append(")");
}

}  // namespace stowage
