#include "allocator/config.hpp"

#include <charconv>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "base/byte_units.hpp"
#include "base/errors.hpp"

namespace stowage {

namespace {

constexpr double kMaxSplitSizeMb = 1073741824.0;  // 2**30 MiB: 1 PiB

constexpr std::string_view kKnownKeys =
    "max_split_size_mb, limit, memory_fraction, virtual_memory, reserve_headroom, "
    "move_pages_above, placement";

std::string_view trim(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

double parse_number(std::string_view key, std::string_view value) {
  double number = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  STOWAGE_CHECK(error == std::errc() && end == value.data() + value.size(),
                "allocator config: ", key, " needs a number, not '", value, "'");
  return number;
}

// The choice `value` names, of those listed; throws LogicError listing them ("auto, on or off").
template <typename Choice>
Choice parse_choice(std::string_view key, std::string_view value,
                    std::initializer_list<std::pair<std::string_view, Choice>> choices) {
  std::ostringstream names;
  std::size_t index = 0;
  for (const auto& [name, choice] : choices) {
    if (name == value) return choice;
    names << (index == 0 ? "" : index + 1 == choices.size() ? " or " : ", ") << name;
    ++index;
  }
  STOWAGE_THROW(LogicError, "allocator config: ", key, " must be ", names.str(), ", not '", value,
                "'");
}

}  // namespace

AllocatorConfig parse_allocator_config(std::string_view text) {
  AllocatorConfig config;
  std::set<std::string, std::less<>> seen;
  while (!trim(text).empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    STOWAGE_CHECK(colon != std::string_view::npos, "allocator config: '", item,
                  "' is not key:value");
    const std::string_view key = trim(item.substr(0, colon));
    const std::string_view value = trim(item.substr(colon + 1));
    STOWAGE_CHECK(seen.emplace(key).second, "allocator config: ", key, " is given twice");
    if (key == "max_split_size_mb") {
      const double mib = parse_number(key, value);
      // Up to 20 MiB every medium segment would count as oversize and never be shared; above
      // 1 PiB (2**30 MiB) the size in bytes would overflow (and no device is that large).
      STOWAGE_CHECK(mib > 20 && mib <= kMaxSplitSizeMb,
                    "allocator config: max_split_size_mb must be more than 20 and at most 1073741824 "
                    "(1 PiB), not ", value);
      config.max_split_size = static_cast<std::size_t>(mib * 1024 * 1024);
    } else if (key == "limit") {
      config.limit_bytes = parse_byte_size(value);
      STOWAGE_CHECK(config.limit_bytes > 0, "allocator config: limit must be positive");
    } else if (key == "memory_fraction") {
      config.memory_fraction = parse_number(key, value);
      STOWAGE_CHECK(config.memory_fraction > 0 && config.memory_fraction <= 1,
                    "allocator config: memory_fraction must be in (0, 1], not ", value);
    } else if (key == "virtual_memory") {
      config.virtual_memory = parse_choice<VirtualMemoryMode>(
          key, value,
          {{"auto", VirtualMemoryMode::kAuto}, {"on", VirtualMemoryMode::kOn},
           {"off", VirtualMemoryMode::kOff}});
    } else if (key == "reserve_headroom") {
      config.reserve_headroom = parse_number(key, value);
      STOWAGE_CHECK(config.reserve_headroom >= 0 && config.reserve_headroom <= 1,
                    "allocator config: reserve_headroom must be in [0, 1], not ", value);
    } else if (key == "move_pages_above") {
      config.move_pages_above = parse_number(key, value);
      STOWAGE_CHECK(config.move_pages_above >= 0 && config.move_pages_above <= 1,
                    "allocator config: move_pages_above must be in [0, 1], not ", value);
    } else if (key == "placement") {
      config.placement = parse_choice<PlacementMode>(
          key, value, {{"dynamic", PlacementMode::kDynamic}, {"learned", PlacementMode::kLearned}});
    } else {
      STOWAGE_THROW(LogicError, "allocator config: unknown key '", key, "' (known: ", kKnownKeys,
                    ")");
    }
  }
  STOWAGE_CHECK(config.placement != PlacementMode::kLearned ||
                    config.virtual_memory != VirtualMemoryMode::kOff,
                "allocator config: placement:learned places blocks in the paged path, which "
                "virtual_memory:off turns off; use one or the other");
  return config;
}

std::string AllocatorConfig::to_string() const {
  std::ostringstream out;
  const char* separator = "";
  if (max_split_size != kUnlimited) {
    out << separator << "max_split_size_mb:" << static_cast<double>(max_split_size) / (1024.0 * 1024.0);
    separator = ",";
  }
  if (limit_bytes != kUnlimited) {
    out << separator << "limit:" << limit_bytes;
    separator = ",";
  }
  if (memory_fraction != 1.0) {
    out << separator << "memory_fraction:" << memory_fraction;
    separator = ",";
  }
  if (virtual_memory != VirtualMemoryMode::kAuto) {
    out << separator << "virtual_memory:" << (virtual_memory == VirtualMemoryMode::kOn ? "on" : "off");
    separator = ",";
  }
  if (reserve_headroom != kDefaultReserveHeadroom) {
    out << separator << "reserve_headroom:" << reserve_headroom;
    separator = ",";
  }
  if (move_pages_above != kDefaultMovePagesAbove) {
    out << separator << "move_pages_above:" << move_pages_above;
    separator = ",";
  }
  if (placement != kDefaultPlacement) {
    out << separator << "placement:" << (placement == PlacementMode::kLearned ? "learned" : "dynamic");
  }
  return out.str();
}

}  // namespace stowage
