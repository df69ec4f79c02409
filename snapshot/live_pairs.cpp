#include "snapshot/live_pairs.hpp"

#include <unordered_map>

#include "base/errors.hpp"
#include "snapshot/names.hpp"

namespace stowage::snapshot {

namespace {

const std::uint8_t kAllocCode = *action_code(Name::kAlloc);
const std::uint8_t kFreeCode = *action_code(Name::kFreeCompleted);

}  // namespace

std::size_t count_positions(std::span<const std::uint8_t> action) {
  std::size_t n = 0;
  for (const std::uint8_t code : action) n += code == kAllocCode || code == kFreeCode ? 1U : 0U;
  return n;
}

template <typename Position>
void pair_allocations(std::span<const std::uint8_t> action, std::span<const std::uint64_t> addr,
                      std::span<const std::uint64_t> size, const LivePairsOut<Position>& out) {
  STOWAGE_CHECK(addr.size() == action.size() && size.size() == action.size(), "the columns action (", action.size(),
                "), addr (", addr.size(), ") and size (", size.size(), ") must have one entry an event");
  const std::size_t n = out.index.size();
  STOWAGE_CHECK(out.is_alloc.size() == n && out.size.size() == n && out.own.size() == n && out.unknown.size() == n &&
                    out.alloc_of.size() == n && out.end.size() == n,
                "the pairing's outputs must have one entry a position");
  // The latest position at each address, and whether it is an allocation (not yet ended).
  struct Latest {
    Position position;
    bool alloc;
  };
  std::unordered_map<std::uint64_t, Latest> latest;
  std::size_t p = 0;
  for (std::size_t event = 0; event < action.size(); ++event) {
    const bool alloc = action[event] == kAllocCode;
    if (!alloc && action[event] != kFreeCode) continue;
    STOWAGE_CHECK(p < n, "the pairing's outputs are shorter than the trace's positions");
    const auto here = static_cast<Position>(p);
    const auto bytes = static_cast<std::int64_t>(size[event]);
    out.index[p] = static_cast<Position>(event);
    out.is_alloc[p] = alloc ? 1 : 0;
    out.size[p] = bytes;
    out.alloc_of[p] = -1;
    out.end[p] = static_cast<Position>(n);
    out.own[p] = alloc ? bytes : 0;
    out.unknown[p] = alloc ? 0 : bytes;
    auto [found, inserted] = latest.try_emplace(addr[event], Latest{here, alloc});
    if (!inserted) {
      if (!alloc && found->second.alloc) {  // the free ends the latest allocation of its address
        const auto ended = static_cast<std::size_t>(found->second.position);
        out.own[p] = -out.size[ended];
        out.unknown[p] = 0;
        out.alloc_of[p] = found->second.position;
        out.end[ended] = here;
      }
      found->second = Latest{here, alloc};
    }
    ++p;
  }
  STOWAGE_CHECK(p == n, "the pairing's outputs are longer than the trace's positions");
}

template void pair_allocations<std::int32_t>(std::span<const std::uint8_t>, std::span<const std::uint64_t>,
                                             std::span<const std::uint64_t>, const LivePairsOut<std::int32_t>&);
template void pair_allocations<std::int64_t>(std::span<const std::uint8_t>, std::span<const std::uint64_t>,
                                             std::span<const std::uint64_t>, const LivePairsOut<std::int64_t>&);

}  // namespace stowage::snapshot
