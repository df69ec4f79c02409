// The caching allocator's paged path: reservations, pages mapped into holes, stitching and
// release (Note [Paged pool] in caching_allocator.hpp).
#include <algorithm>
#include <exception>

#include "allocator/base/byte_units.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/base/errors.hpp"
#include "allocator/base/log.hpp"

namespace stowage {

namespace {

std::int64_t as_signed(std::size_t bytes) { return static_cast<std::int64_t>(bytes); }

std::size_t round_down(std::size_t value, std::size_t multiple) { return value - value % multiple; }

// Address space reserved per (pool, stream): the device's memory, so one reservation holds
// anything the device can; more are added when holes run out. Capped so that replays of huge
// simulated devices keep their page tables small.
constexpr std::size_t kMaxReservation = std::size_t{1} << 40;  // 1 TiB

// Stitching takes a free block's pages all at once when they are at most this many times the
// pages missing (steal_pages_locked). 16 keeps the memory of taking blocks whole on every
// recorded trace (4 cost up to 0.7 per cent more) while one request moves at most 16 times
// the pages it needs.
constexpr std::size_t kWholeVictimFactor = 16;

void* address(std::uintptr_t value) { return reinterpret_cast<void*>(value); }

}  // namespace

Block* CachingAllocator::grow_paged_locked(Pool pool, Stream stream, std::size_t rounded,
                                           std::uint64_t context) {
  // Choose the hole needing the fewest new pages (Note [Paged pool]).
  struct Choice {
    Block* hole = nullptr;
    std::size_t pages = 0;  // new pages needed, after what a free block before the hole holds
  };
  Choice best;
  auto consider = [&](Block* hole) {
    if (hole == nullptr || overlaps_lost_range(*hole)) return;
    Block* lead = hole->prev;
    if (lead == nullptr || lead->state != BlockState::kFree || !lead->mapped) {
      lead = nullptr;
    } else if (lead->size >= rounded) {
      // A free block that large was refused by the cache (the oversize rule); pages mapped
      // after it would join it, so this hole is not for this request.
      return;
    }
    const std::size_t lacking = rounded - (lead == nullptr ? 0 : lead->size);
    const std::size_t pages = (lacking + page_ - 1) / page_;
    if (pages * page_ > hole->size) return;
    if (best.hole == nullptr || pages < best.pages) best = {hole, pages};
  };
  FreeBlockIndex& holes = holes_of(pool);
  consider(holes.best_fit(stream, rounded));
  consider(holes.largest(stream));
  if (best.hole == nullptr) consider(reserve_paged_locked(pool, stream, rounded, context));
  if (best.hole == nullptr) return nullptr;

  // Stitching may unmap the free block after the hole, which then joins the hole: find the
  // hole again through its left neighbour, which stitching never touches.
  Block* const before_hole = best.hole->prev;
  Segment* const hole_segment = best.hole->segment;
  std::vector<PhysicalHandle> handles;
  handles.reserve(best.pages);
  gather_pages_locked(best.pages, rounded, before_hole, handles);
  best.hole = before_hole != nullptr ? before_hole->next : hole_segment->first;
  STOWAGE_INTERNAL_ASSERT(best.hole->state == BlockState::kFree && !best.hole->mapped,
                          "the hole to map into was lost while gathering pages");
  if (handles.size() < best.pages) {
    release_pages_locked(handles);
    return nullptr;
  }
  if (handles.size() > best.pages) {
    // Stitching moved whole blocks: map the surplus after the request as cache, as far as the
    // hole reaches (and short of any range set aside inside it), and give the rest back. With
    // an oversize class, the cache left after the request stays below it: a remainder the cache
    // refuses would only be moved again by the next miss.
    std::size_t fit = std::min(handles.size(), best.hole->size / page_);
    for (const auto& [start, bytes] : lost_ranges_) {
      if (start >= best.hole->address && start < best.hole->address + best.hole->size) {
        fit = std::min(fit, (start - best.hole->address) / page_);
      }
    }
    if (config_.max_split_size != AllocatorConfig::kUnlimited) {
      fit = std::min(fit, best.pages + (config_.max_split_size - 1) / page_ - 1);
    }
    fit = std::max(fit, best.pages);
    std::vector<PhysicalHandle> surplus(handles.begin() + static_cast<std::ptrdiff_t>(fit),
                                        handles.end());
    handles.resize(fit);
    release_pages_locked(surplus);
    best.pages = fit;
  }

  // Map them at the start of the hole.
  Block* hole = best.hole;
  const bool usable = map_pages_locked(hole->address, handles);
  if (handles.empty()) return nullptr;
  Block* block = adopt_mapped_pages_locked(hole, handles, context);
  if (!usable) return nullptr;  // the pages became cache; the request fails this time
  STOWAGE_INTERNAL_ASSERT(block->size >= rounded, "mapped ", handles.size(),
                          " pages for a block of ",
                          rounded, " bytes but the cached block holds ", block->size);
  count_inactive_split_locked(*block, -1);
  index_of(pool).erase(*block);
  return block;
}

bool CachingAllocator::gather_pages_locked(std::size_t count, std::size_t rounded,
                                           const Block* keep,
                                           std::vector<PhysicalHandle>& handles) {
  const std::size_t target = handles.size() + count;
  const std::size_t limit = limit_locked();
  const double in_use = static_cast<double>(std::max(
      active_high_water_, static_cast<std::size_t>(stats_.active_bytes.all().current) + rounded));
  while (handles.size() < target) {
    const std::size_t held =
        static_cast<std::size_t>(stats_.reserved_bytes.all().current) + handles.size() * page_;
    const bool within_limit = held <= limit && page_ <= limit - held;
    const bool within_headroom =
        static_cast<double>(held + page_) <=
        (1.0 + config_.reserve_headroom) * in_use + static_cast<double>(learned_headroom_);
    if (within_limit && within_headroom && create_page_locked(handles)) continue;
    if (steal_pages_locked(target - handles.size(), keep, handles) > 0) continue;
    if (within_limit && !within_headroom && create_page_locked(handles)) continue;
    break;
  }
  return handles.size() >= target;
}

bool CachingAllocator::map_pages_locked(std::uintptr_t start,
                                        std::vector<PhysicalHandle>& handles) {
  std::size_t mapped = 0;
  try {
    for (; mapped < handles.size(); ++mapped) {
      backend_.map(address(start + mapped * page_), page_, handles[mapped]);
    }
    backend_.set_access(address(start), handles.size() * page_);
    return true;
  } catch (const std::exception& error) {
    log_warning(detail::concat("mapping ", format_bytes(handles.size() * page_),
                               " of device memory failed: ", error.what()));
  }
  // Undo the maps that succeeded, trying again on a transient failure. If the device keeps
  // refusing, keep the mapped pages as cache rather than lose track of them.
  for (int attempt = 0; mapped > 0 && attempt < 3; ++attempt) {
    try {
      backend_.unmap(address(start), mapped * page_);
      mapped = 0;
    } catch (const std::exception&) {
    }
  }
  if (mapped > 0) {
    try {
      backend_.set_access(address(start), mapped * page_);
    } catch (const std::exception& error) {
      log_warning(detail::concat("device memory at ", address(start),
                                 " can be neither unmapped nor made accessible (", error.what(),
                                 "); ", mapped, " page(s) are set aside until they unmap"));
      // The handles are released below (their memory returns once unmapped); the range stays
      // out of use, and every release tries to unmap it again.
      lost_ranges_.emplace_back(start, mapped * page_);
      mapped = 0;
    }
  }
  std::vector<PhysicalHandle> unused(handles.begin() + static_cast<std::ptrdiff_t>(mapped),
                                     handles.end());
  release_pages_locked(unused);
  handles.resize(mapped);
  return false;
}

Block* CachingAllocator::adopt_mapped_pages_locked(Block* hole,
                                                  const std::vector<PhysicalHandle>& handles,
                                                  std::uint64_t context) {
  Segment& segment = *hole->segment;
  const Pool pool = segment.pool;
  const std::uintptr_t start = hole->address;
  const std::size_t pages = handles.size();
  const std::size_t bytes = pages * page_;
  Block* rest = hole->size > bytes ? arena_.acquire() : nullptr;
  const std::size_t first_page = (start - segment.base) / page_;
  if (segment.pages.size() < first_page + pages) segment.pages.resize(first_page + pages, 0);
  for (std::size_t i = 0; i < pages; ++i) segment.pages[first_page + i] = handles[i].value;
  segment.mapped_pages += pages;
  stats_.reserved_bytes.update(pool, as_signed(bytes));
  stats_.mapped_pages.update(as_signed(pages));
  stats_.num_maps += as_signed(pages);
  record_locked(TraceAction::kSegmentMap, start, bytes, hole->stream, context);

  // The mapped part of the hole becomes cache, joined to the free mapped block before it.
  index_for(*hole).erase(*hole);
  if (rest != nullptr) {
    split_after_locked(hole, bytes, rest);  // rest stays unmapped, like the hole
    index_for(*rest).insert(*rest);
  }
  hole->mapped = true;
  return insert_free_locked(hole);
}

Block* CachingAllocator::reserve_paged_locked(Pool pool, Stream stream, std::size_t rounded,
                                              std::uint64_t context) {
  const std::size_t device = round_up(backend_.properties().total_bytes, page_);
  if (rounded > device) return nullptr;  // no device could ever hold it
  const std::size_t size = std::max(std::min(device, kMaxReservation), round_up(rounded, page_));
  void* base = nullptr;
  try {
    base = backend_.reserve_address_range(size, page_);
  } catch (const std::exception& error) {
    log_warning(detail::concat("reserving ", format_bytes(size),
                               " of device address space failed: ",
                               error.what()));
    return nullptr;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  Block* hole = nullptr;
  try {
    hole = add_segment_locked(start, size, stream, pool, context, /*paged=*/true);
    if (std::find(paged_streams_.begin(), paged_streams_.end(), stream) == paged_streams_.end()) {
      paged_streams_.push_back(stream);
    }
  } catch (...) {
    if (hole != nullptr) {
      arena_.recycle(hole);
      segments_.erase(start);
    }
    backend_.release_address_range(base, size);
    throw;
  }
  holes_of(pool).insert(*hole);
  stats_.segment.update(pool, 1);
  return hole;
}

bool CachingAllocator::overlaps_lost_range(const Block& hole) const noexcept {
  for (const auto& [start, bytes] : lost_ranges_) {
    if (start < hole.address + hole.size && hole.address < start + bytes) return true;
  }
  return false;
}

bool CachingAllocator::create_page_locked(std::vector<PhysicalHandle>& out) {
  std::optional<PhysicalHandle> handle;
  try {
    handle = backend_.try_create_physical(page_);
  } catch (const std::exception& error) {
    log_warning(detail::concat("creating a page of device memory failed: ", error.what()));
    return false;
  }
  if (!handle) return false;
  out.push_back(*handle);
  ++stats_.num_device_alloc;
  return true;
}

std::size_t CachingAllocator::steal_pages_locked(std::size_t count, const Block* keep,
                                                 std::vector<PhysicalHandle>& out) {
  // Moving a page waits for its stream, which a capture forbids (Note [Private pools]).
  if (capturing()) return 0;
  // Free mapped blocks holding at least one whole page, largest first, each taken whole when
  // that moves at most kWholeVictimFactor times what is missing: the free space moves to the
  // growth front in few pieces, and a victim keeps only the partial pages it shares with live
  // neighbours. Taking a few pages from many small blocks instead chops the cache into slivers
  // that no later request fits (1-2 per cent more memory on the recorded traces); the cap keeps
  // one small request from moving a huge free block page by page.
  auto whole_pages = [&](const Block& block) {
    const std::uintptr_t first = round_up(block.address, page_);
    const std::uintptr_t last = round_down(block.address + block.size, page_);
    return last > first ? (last - first) / page_ : 0;
  };
  // Each (pool, stream) list is ordered by size: the largest blocks of each, until that list
  // alone would cover the need, are all that the merged largest-first order can reach.
  std::vector<Block*> victims;
  for (const Pool pool : {Pool::kSmall, Pool::kLarge}) {
    for (const Stream stream : paged_streams_) {
      std::size_t listed = 0;
      index_of(pool).for_each_fitting_largest_first(stream, page_, [&](Block& block) {
        const std::size_t pages = &block == keep ? 0 : whole_pages(block);
        if (pages == 0) return true;
        victims.push_back(&block);
        listed += pages;
        return listed < count;
      });
    }
  }
  std::sort(victims.begin(), victims.end(), [](const Block* a, const Block* b) {
    return a->size != b->size ? a->size > b->size : a->address < b->address;
  });
  const std::size_t before = out.size();
  std::vector<Stream> synchronized;
  for (Block* victim : victims) {
    const std::size_t missing = count - std::min(count, out.size() - before);
    if (missing == 0) break;
    // Work queued on the victim's stream before its free may still touch these pages.
    if (std::find(synchronized.begin(), synchronized.end(), victim->stream) == synchronized.end()) {
      try {
        backend_.synchronize_stream(victim->stream);
      } catch (const std::exception&) {
        // A stream destroyed since the free (or failing): waiting for the device covers it.
        try {
          backend_.synchronize_device();
        } catch (const std::exception& error) {
          log_warning(detail::concat("cannot move cached pages: synchronising failed: ",
                                     error.what()));
          continue;
        }
      }
      synchronized.push_back(victim->stream);
    }
    const std::size_t had = out.size();
    const std::uintptr_t last = round_down(victim->address + victim->size, page_);
    const std::size_t pages = whole_pages(*victim);
    const std::size_t take = pages <= kWholeVictimFactor * missing ? pages : missing;
    unmap_pages_locked(victim, last - take * page_, last, out);
    moved_pages_ += out.size() - had;
    // A loop that has moved an eighth of the pages it uses without needing more memory churns:
    // allow it 1% more reserve, and again each time it moves that much more, until its layout
    // fits and the moves stop (Note [Paged pool]).
    if (8 * moved_pages_ * page_ >= active_high_water_) {
      learned_headroom_ += std::max(page_, active_high_water_ / 100);
      moved_pages_ = 0;
    }
  }
  return out.size() - before;
}

bool CachingAllocator::unmap_pages_locked(Block* block, std::uintptr_t first, std::uintptr_t last,
                                          std::vector<PhysicalHandle>& out) {
  Segment& segment = *block->segment;
  const Pool pool = segment.pool;
  const bool has_head = first > block->address;
  const bool has_tail = last < block->address + block->size;
  // Take the bookkeeping first, so that nothing can fail after the device has unmapped.
  Block* head = has_head ? arena_.acquire() : nullptr;
  Block* tail = nullptr;
  try {
    if (has_tail) tail = arena_.acquire();
    out.reserve(out.size() + (last - first) / page_);
    backend_.unmap(address(first), last - first);
  } catch (const std::exception& error) {
    if (head != nullptr) arena_.recycle(head);
    if (tail != nullptr) arena_.recycle(tail);
    log_warning(detail::concat("unmapping ", format_bytes(last - first),
                               " of device memory failed: ", error.what()));
    return false;
  }
  const std::size_t pages = (last - first) / page_;
  for (std::size_t page = (first - segment.base) / page_, end = page + pages; page < end; ++page) {
    out.push_back(PhysicalHandle{segment.pages[page]});
    segment.pages[page] = 0;
  }
  segment.mapped_pages -= pages;
  stats_.reserved_bytes.update(pool, -as_signed(last - first));
  stats_.mapped_pages.update(-as_signed(pages));
  stats_.num_unmaps += as_signed(pages);
  record_locked(TraceAction::kSegmentUnmap, first, last - first, block->stream, 0);

  // Cut the block into [head][hole][tail]; the head and tail stay cached.
  count_inactive_split_locked(*block, -1);
  index_of(pool).erase(*block);
  if (tail != nullptr) split_after_locked(block, last - block->address, tail);
  Block* hole = block;
  if (head != nullptr) {
    // block keeps the head; head (the spare) becomes the hole.
    hole = head;
    split_after_locked(block, first - block->address, hole);
    index_of(pool).insert(*block);
    count_inactive_split_locked(*block, 1);
  }
  hole->mapped = false;
  if (tail != nullptr) {
    index_of(pool).insert(*tail);
    count_inactive_split_locked(*tail, 1);
  }
  insert_free_locked(hole);
  return true;
}

void CachingAllocator::release_pages_locked(std::vector<PhysicalHandle>& handles) {
  for (const PhysicalHandle handle : handles) {
    try {
      backend_.release_physical(handle);
      ++stats_.num_device_free;
    } catch (const std::exception& error) {
      log_warning(detail::concat("releasing a page of device memory failed: ", error.what()));
    }
  }
  handles.clear();
}

bool CachingAllocator::release_paged_locked() {
  // Every whole page under a free mapped block goes back to the device.
  std::vector<Block*> victims;
  for (FreeBlockIndex& index : pools_) {
    index.for_each([&](const Block& block) {
      if (round_down(block.address + block.size, page_) > round_up(block.address, page_)) {
        victims.push_back(const_cast<Block*>(&block));
      }
    });
  }
  std::vector<PhysicalHandle> handles;
  bool released = false;
  if (!victims.empty()) {
    // Work queued before the frees may still touch these pages.
    try {
      backend_.synchronize_device();
    } catch (const std::exception& error) {
      log_warning(detail::concat("cannot release cached pages: synchronising the device failed: ",
                                 error.what()));
      victims.clear();
    }
  }
  for (Block* victim : victims) {
    const std::uintptr_t first = round_up(victim->address, page_);
    const std::uintptr_t last = round_down(victim->address + victim->size, page_);
    if (unmap_pages_locked(victim, first, last, handles)) released = true;
    release_pages_locked(handles);
  }
  // Ranges set aside after a failed map: try to unmap them again.
  std::erase_if(lost_ranges_, [&](const std::pair<std::uintptr_t, std::size_t>& range) {
    try {
      backend_.unmap(address(range.first), range.second);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  });
  // Reservations with nothing mapped go back too.
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment& segment = it->second;
    Block* hole = segment.first;
    if (!segment.paged || segment.planned || segment.mapped_pages != 0 || hole->next != nullptr ||
        overlaps_lost_range(*hole)) {
      ++it;
      continue;
    }
    holes_of(segment.pool).erase(*hole);
    try {
      backend_.release_address_range(address(segment.base), segment.size);
    } catch (const std::exception& error) {
      holes_of(segment.pool).insert(*hole);
      log_warning(detail::concat("releasing device address space failed: ", error.what()));
      ++it;
      continue;
    }
    stats_.segment.update(segment.pool, -1);
    arena_.recycle(hole);
    it = segments_.erase(it);
    released = true;
  }
  return released;
}

void CachingAllocator::snapshot_paged_segment(const Segment& segment,
                                              AllocatorSnapshot& out) const {
  // Each run of mapped pages is reported as a segment, as torch reports an expandable segment's
  // mapped part: runs start and end at holes, which are page-aligned, so blocks tile each run.
  SegmentSnapshot* shot = nullptr;
  for (const Block* block = segment.first; block != nullptr; block = block->next) {
    if (!block->mapped) {
      shot = nullptr;
      continue;
    }
    if (shot == nullptr) {
      shot = &out.segments.emplace_back();
      shot->address = block->address;
      shot->stream = segment.stream;
      shot->pool = segment.pool;
      shot->context = segment.context;
      shot->is_expandable = true;
    }
    shot->total_size += block->size;
    shot->blocks.push_back({block->address, block->size, block->requested, block->state,
                            block->context});
    if (block->state != BlockState::kFree) shot->active_size += block->size;
    if (block->state == BlockState::kAllocated) {
      shot->allocated_size += block->size;
      shot->requested_size += block->requested;
    }
  }
}

}  // namespace stowage
