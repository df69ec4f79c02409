#include "snapshot/names.hpp"

#include <array>

namespace stowage::snapshot {

namespace {

constexpr std::array<std::string_view, kNameCount> kTexts = {
    "",
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "device_free",
    "user_metadata",
    "segments",
    "device_traces",
    "address",
    "total_size",
    "device",
    "blocks",
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
};

constexpr std::size_t kLongest = 14;  // "free_requested", "free_completed"

}  // namespace

Name name_of(std::string_view text) {
  if (text.size() < 3 || text.size() > kLongest) return Name::kOther;
  for (int i = 1; i < kNameCount; ++i) {
    if (kTexts[static_cast<std::size_t>(i)] == text) return static_cast<Name>(i);
  }
  return Name::kOther;
}

std::string_view text_of(Name name) {
  const auto index = static_cast<std::size_t>(name);
  return index < kTexts.size() ? kTexts[index] : std::string_view{};
}

}  // namespace stowage::snapshot
