#include "snapshot/native_figures.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <vector>

#include "snapshot/device_events.hpp"
#include "snapshot/names.hpp"

namespace stowage::snapshot {

namespace {
constexpr Wide kLastAddress = std::numeric_limits<std::uint64_t>::max();
}  // namespace

NativeFigures native_figures(std::span<const std::uint8_t> action, std::span<const std::uint64_t> addr,
                             std::span<const std::uint64_t> size, std::span<const SegmentExtent> segments) {
  const ReservedPeak reserved = reserved_peak(action, addr, size);  // (checks the columns' lengths)
  NativeFigures found{reserved.peak, 0, 0, 0, 0};
  std::vector<SegmentExtent> preexisting;
  for (const SegmentExtent& segment : segments) {
    const bool traced = segment.address >= 0 && segment.address <= kLastAddress &&
                        std::binary_search(reserved.created.begin(), reserved.created.end(),
                                           static_cast<std::uint64_t>(segment.address));
    if (traced) continue;
    preexisting.push_back(segment);
    found.preexisting_bytes += segment.size;
  }
  found.preexisting_segments = static_cast<std::int64_t>(preexisting.size());
  std::sort(preexisting.begin(), preexisting.end(), [](const SegmentExtent& a, const SegmentExtent& b) {
    return a.address != b.address ? a.address < b.address : a.size < b.size;
  });
  const auto beyond = std::find_if(preexisting.begin(), preexisting.end(),
                                   [](const SegmentExtent& s) { return s.address > kLastAddress; });
  preexisting.erase(beyond, preexisting.end());  // no trace address reaches them
  const std::uint8_t alloc = *action_code(Name::kAlloc);
  for (std::size_t e = 0; e < action.size(); ++e) {
    if (action[e] != alloc) continue;
    const Wide at = addr[e];
    const auto after = std::upper_bound(preexisting.begin(), preexisting.end(), at,
                                        [](Wide value, const SegmentExtent& s) { return value < s.address; });
    if (after == preexisting.begin()) continue;
    const SegmentExtent& segment = *std::prev(after);
    if (at < segment.address + segment.size) {
      ++found.allocs_in_preexisting;
      found.bytes_in_preexisting += size[e];
    }
  }
  return found;
}

}  // namespace stowage::snapshot
