#include "base/byte_units.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "base/errors.hpp"

namespace stowage {

namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

}  // namespace

std::size_t parse_byte_size(std::string_view text) {
  const std::string_view trimmed = trim(text);
  std::size_t number_end = 0;
  while (number_end < trimmed.size() &&
         (std::isdigit(static_cast<unsigned char>(trimmed[number_end])) || trimmed[number_end] == '.')) {
    ++number_end;
  }
  double number = 0;
  const auto [end, error] = std::from_chars(trimmed.data(), trimmed.data() + number_end, number);
  STOWAGE_CHECK(number_end > 0 && error == std::errc() && end == trimmed.data() + number_end,
                "'", text, "' is not a byte size (expected a number and a unit, like 4GiB)");
  const std::string unit = lowercase(trim(trimmed.substr(number_end)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "kib" || unit == "k") scale = 1024.0;
  else if (unit == "mib" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "tb") scale = 1e12;
  STOWAGE_CHECK(scale > 0, "'", text, "' has an unknown unit '", unit,
                "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  const double bytes = std::round(number * scale);
  STOWAGE_CHECK(bytes < static_cast<double>(std::numeric_limits<std::size_t>::max()), "'", text,
                "' is too large");
  return static_cast<std::size_t>(bytes);
}

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f %s", value, kUnits[unit]);
  return buffer;
}

std::string with_commas(std::uint64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  out.reserve(digits.size() + digits.size() / 3);
  const std::size_t lead = digits.size() % 3 == 0 ? 3 : digits.size() % 3;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i >= lead && (i - lead) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace stowage
