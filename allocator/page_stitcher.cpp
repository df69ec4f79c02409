#include "allocator/page_stitcher.hpp"

#include <algorithm>
#include <exception>

#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/numbers.hpp"
#include "device_call_timer.hpp"

namespace stowage {

namespace {

// Stitching takes a free block's pages all at once when they are at most this many times the
// pages missing: free space then moves to the growth front in few pieces, while one request
// moves at most this many times the pages it needs (the stitching rules are measured in
// bench/results/2026-11-22-cpu-fragmentation.md).
constexpr std::size_t kWholeVictimFactor = 16;

// The whole pages of a block (those it does not share with a neighbour).
std::size_t whole_pages(const Block& block, std::size_t page) {
  const std::uintptr_t first = round_up(block.address, page);
  const std::uintptr_t last = round_down(block.address + block.size, page);
  return last > first ? (last - first) / page : 0;
}

}  // namespace

PageStitcher::PageStitcher(DeviceBackend& backend, PagedMemory& memory, DeviceStats& stats,
                           const MemoryLimit& limit, ReserveBudget& budget, Pool& shared,
                           double move_above)
    : backend_(backend),
      memory_(memory),
      stats_(stats),
      limit_(limit),
      budget_(budget),
      shared_(shared),
      move_above_(move_above) {}

bool PageStitcher::gather(std::size_t count, std::size_t rounded, const Block* keep,
                          bool capturing, std::vector<PhysicalHandle>& handles) {
  const std::size_t page = memory_.page();
  const std::size_t target = handles.size() + count;
  while (handles.size() < target) {
    const std::size_t held =
        static_cast<std::size_t>(stats_.reserved_bytes.all().current) + handles.size() * page;
    const bool within_limit = limit_.allows(held, page);
    const bool with_room = static_cast<double>(held + page) <=
                           move_above_ * static_cast<double>(limit_.bytes());
    const bool within_budget = with_room || budget_.allows(held + page, rounded);
    if (within_limit && within_budget && memory_.create_page(handles)) continue;
    if (!capturing && steal(target - handles.size(), keep, handles) > 0) continue;
    if (within_limit && !within_budget && memory_.create_page(handles)) continue;
    break;
  }
  return handles.size() >= target;
}

std::vector<Block*> PageStitcher::victims(std::size_t count, const Block* keep) {
  // Free mapped blocks holding at least one whole page, largest first, each taken whole when
  // that moves at most kWholeVictimFactor times what is missing: a victim keeps only the partial
  // pages it shares with live neighbours. Taking a few pages from many small blocks instead
  // chops the cache into slivers that no later request fits; the cap keeps one small request
  // from moving a huge free block page by page.
  // Each (size class, stream) list is ordered by size: the largest blocks of each, until that
  // list alone would cover the need, are all that the merged largest-first order can reach.
  const std::size_t page = memory_.page();
  std::vector<Block*> found;
  for (const SizeClass size_class : {SizeClass::kSmall, SizeClass::kLarge}) {
    for (const Stream stream : memory_.streams()) {
      std::size_t listed = 0;
      shared_.cached(size_class).for_each_fitting_largest_first(stream, page, [&](Block& block) {
        const std::size_t pages = &block == keep ? 0 : whole_pages(block, page);
        if (pages == 0) return true;
        found.push_back(&block);
        listed += pages;
        return listed < count;
      });
    }
  }
  std::sort(found.begin(), found.end(), [](const Block* a, const Block* b) {
    return a->size != b->size ? a->size > b->size : a->address < b->address;
  });
  return found;
}

std::size_t PageStitcher::steal(std::size_t count, const Block* keep,
                                std::vector<PhysicalHandle>& out) {
  const std::size_t page = memory_.page();
  const std::size_t before = out.size();
  std::vector<Stream> synchronized;
  for (Block* victim : victims(count, keep)) {
    const std::size_t missing = count - std::min(count, out.size() - before);
    if (missing == 0) break;
    // Work queued on the victim's stream before its free may still touch these pages.
    if (std::find(synchronized.begin(), synchronized.end(), victim->stream) == synchronized.end()) {
      try {
        timed_call(stats_, [&] { backend_.synchronize_stream(victim->stream); });
      } catch (const std::exception&) {
        // A stream destroyed since the free (or failing): waiting for the device covers it.
        try {
          timed_call(stats_, [&] { backend_.synchronize_device(); });
        } catch (const std::exception& error) {
          log_warning(detail::concat("cannot move cached pages: synchronising failed: ",
                                     error.what()));
          continue;
        }
      }
      synchronized.push_back(victim->stream);
    }
    const std::size_t had = out.size();
    const std::uintptr_t last = round_down(victim->address + victim->size, page);
    const std::size_t pages = whole_pages(*victim, page);
    const std::size_t take = pages <= kWholeVictimFactor * missing ? pages : missing;
    memory_.unmap(victim, last - take * page, last, out);
    budget_.note_churn((out.size() - had) * page);
  }
  return out.size() - before;
}

}  // namespace stowage
