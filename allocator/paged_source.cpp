#include "allocator/paged_source.hpp"

#include <algorithm>
#include <exception>

#include "allocator/config.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/numbers.hpp"
#include "device_call_timer.hpp"

namespace stowage {

namespace {

// Address space reserved per (size class, stream): the device's memory, so one reservation
// holds anything the device can; more are added when holes run out. Capped so that replays of
// huge simulated devices keep their page tables small.
constexpr std::size_t kMaxReservation = std::size_t{1} << 40;  // 1 TiB

}  // namespace

PagedSource::PagedSource(const SourceParts& parts)
    : backend_(parts.backend),
      cache_(parts.cache),
      stats_(parts.stats),
      shared_(parts.shared),
      max_split_size_(parts.max_split_size),
      device_bytes_(parts.backend.properties().total_bytes),
      memory_(parts.backend, parts.cache, parts.stats, parts.trace),
      stitcher_(parts.backend, memory_, parts.stats, parts.limit, parts.budget, parts.shared,
                parts.move_pages_above) {}

Block* PagedSource::grow(const GrowRequest& request) {
  Choice best = choose_hole(request);
  if (best.hole == nullptr) return nullptr;
  // Stitching may unmap the free block after the hole, which then joins the hole: find the
  // hole again through its left neighbour, which stitching never touches.
  Block* const before_hole = best.hole->prev;
  Segment* const hole_segment = best.hole->segment;
  std::vector<PhysicalHandle> handles;
  handles.reserve(best.pages);
  stitcher_.gather(best.pages, request.rounded, before_hole, request.capturing, handles);
  best.hole = before_hole != nullptr ? before_hole->next : hole_segment->first;
  STOWAGE_INTERNAL_ASSERT(best.hole->state == BlockState::kFree && !best.hole->mapped,
                          "the hole to map into was lost while gathering pages");
  if (handles.size() < best.pages) {
    memory_.release_pages(handles);
    return nullptr;
  }
  if (handles.size() > best.pages) trim_surplus(best, handles);

  // Map them at the start of the hole.
  const bool usable = memory_.map(best.hole->address, handles);
  if (handles.empty()) return nullptr;
  Block* block = memory_.adopt(best.hole, handles, request.context);
  if (!usable) return nullptr;  // the pages became cache; the request fails this time
  STOWAGE_INTERNAL_ASSERT(block->size >= request.rounded, "mapped ", handles.size(),
                          " pages for a block of ", request.rounded,
                          " bytes but the cached block holds ", block->size);
  cache_.unindex(*block);
  return block;
}

PagedSource::Choice PagedSource::choose_hole(const GrowRequest& request) {
  const std::size_t page = memory_.page();
  Choice best;
  auto consider = [&](Block* hole) {
    if (hole == nullptr || memory_.overlaps_lost_range(*hole)) return;
    Block* lead = hole->prev;
    if (lead == nullptr || lead->state != BlockState::kFree || !lead->mapped) {
      lead = nullptr;
    } else if (lead->size >= request.rounded) {
      // A free block that large was refused by the cache (the oversize rule); pages mapped
      // after it would join it, so this hole is not for this request.
      return;
    }
    const std::size_t lacking = request.rounded - (lead == nullptr ? 0 : lead->size);
    const std::size_t pages = (lacking + page - 1) / page;
    if (pages * page > hole->size) return;
    if (best.hole == nullptr || pages < best.pages) best = {hole, pages};
  };
  FreeBlockIndex& holes = shared_.holes(request.size_class);
  consider(holes.best_fit(request.stream, request.rounded));
  consider(holes.largest(request.stream));
  if (best.hole == nullptr) consider(reserve(request));
  return best;
}

void PagedSource::trim_surplus(const Choice& choice, std::vector<PhysicalHandle>& handles) {
  std::size_t fit = std::min(handles.size(), memory_.pages_before_lost_range(*choice.hole));
  if (max_split_size_ != AllocatorConfig::kUnlimited) {
    fit = std::min(fit, choice.pages + (max_split_size_ - 1) / memory_.page() - 1);
  }
  fit = std::max(fit, choice.pages);
  std::vector<PhysicalHandle> surplus(handles.begin() + static_cast<std::ptrdiff_t>(fit),
                                      handles.end());
  handles.resize(fit);
  memory_.release_pages(surplus);
}

Block* PagedSource::reserve(const GrowRequest& request) {
  const std::size_t page = memory_.page();
  const std::size_t device = round_up(device_bytes_, page);
  if (request.rounded > device) return nullptr;  // no device could ever hold it
  const std::size_t bytes =
      std::max(std::min(device, kMaxReservation), round_up(request.rounded, page));
  return memory_.reserve(shared_, request.size_class, request.stream, bytes, request.context);
}

bool PagedSource::release_cached() {
  // Every whole page under a free mapped block of the shared pool goes back to the device.
  const std::size_t page = memory_.page();
  std::vector<Block*> victims;
  for (const SizeClass size_class : {SizeClass::kSmall, SizeClass::kLarge}) {
    shared_.cached(size_class).for_each([&](const Block& block) {
      if (round_down(block.address + block.size, page) > round_up(block.address, page)) {
        victims.push_back(const_cast<Block*>(&block));
      }
    });
  }
  std::vector<PhysicalHandle> handles;
  bool released = false;
  if (!victims.empty()) {
    // Work queued before the frees may still touch these pages.
    try {
      timed_call(stats_, [&] { backend_.synchronize_device(); });
    } catch (const std::exception& error) {
      log_warning(detail::concat("cannot release cached pages: synchronising the device failed: ",
                                 error.what()));
      victims.clear();
    }
  }
  for (Block* victim : victims) {
    const std::uintptr_t first = round_up(victim->address, page);
    const std::uintptr_t last = round_down(victim->address + victim->size, page);
    if (memory_.unmap(victim, first, last, handles)) released = true;
    memory_.release_pages(handles);
  }
  memory_.retry_lost_ranges();
  return memory_.release_empty_reservations(shared_) || released;
}

}  // namespace stowage
