#include "device/nvidia_smi_listing.hpp"

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace stowage {

namespace {

// One line's fields, as Python's csv.reader(skipinitialspace=True) reads them.
std::vector<std::string> csv_fields(std::string_view line) {
  std::vector<std::string> fields;
  if (line.empty()) return fields;
  std::size_t at = 0;
  while (true) {
    while (at < line.size() && line[at] == ' ') ++at;
    std::string field;
    if (at < line.size() && line[at] == '"') {
      for (++at; at < line.size(); ++at) {
        if (line[at] != '"') {
          field += line[at];
        } else if (at + 1 < line.size() && line[at + 1] == '"') {
          field += '"';
          ++at;
        } else {
          ++at;
          break;
        }
      }
    }
    while (at < line.size() && line[at] != ',') field += line[at++];
    fields.push_back(std::move(field));
    if (at == line.size()) return fields;
    ++at;  // the comma
  }
}

bool all_digits(std::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
}

template <typename Number>
std::optional<Number> number_of(std::string_view text) {
  Number value{};
  if (!all_digits(text)) return std::nullopt;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool is_capability(std::string_view text) {
  const std::size_t dot = text.find('.');
  return dot != std::string_view::npos && all_digits(text.substr(0, dot)) && all_digits(text.substr(dot + 1));
}

}  // namespace

std::vector<GpuFacts> nvidia_smi_gpus(std::string_view listing) {
  std::vector<GpuFacts> gpus;
  while (!listing.empty()) {
    const std::size_t end = listing.find('\n');
    std::string_view line = listing.substr(0, end);
    listing = end == std::string_view::npos ? std::string_view{} : listing.substr(end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::vector<std::string> row = csv_fields(line);
    if (row.size() != 5) continue;
    GpuFacts gpu;
    gpu.index = number_of<int>(row[0]).value_or(static_cast<int>(gpus.size()));
    gpu.name = row[1];
    if (const auto mebibytes = number_of<std::uint64_t>(row[2]);
        mebibytes && *mebibytes <= (std::numeric_limits<std::uint64_t>::max() >> 20)) {
      gpu.total_memory = *mebibytes << 20;
    }
    gpu.pci_bus_id = row[3];
    if (is_capability(row[4])) gpu.compute_capability = row[4];
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

}  // namespace stowage
