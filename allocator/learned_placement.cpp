#include "allocator/learned_placement.hpp"

#include <algorithm>
#include <exception>
#include <new>
#include <vector>

#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/numbers.hpp"

namespace stowage {

LearnedPlacement::LearnedPlacement(BlockCache& cache, PagedSource& paged, Pool& shared)
    : cache_(cache), paged_(paged), shared_(shared) {
  records_.reserve(4096);  // a training step's live allocations, mostly: no rehash while learning
}

void LearnedPlacement::mark_step() {
  if (learner_.mark_step()) {
    dissolve();
  } else if (std::optional<StepLearner::Layout> layout = learner_.take_layout()) {
    taken_layout_ = {layout->arena_bytes, layout->peak_live_bytes};
  }
}

LearnedPlacement::Status LearnedPlacement::status() const {
  Status status;
  status.enabled = true;
  status.phase = learner_.phase();
  status.layouts_made = learner_.layouts_made();
  status.departures = learner_.departures();
  status.arena_bytes = arena_segment_ != nullptr ? arena_segment_->size : 0;
  status.layout_live_bytes = arena_segment_ != nullptr ? taken_layout_.live_bytes : 0;
  status.placed_allocations = placed_allocations_;
  return status;
}

void LearnedPlacement::learn(const Block& block, std::size_t rounded, Stream stream) {
  if (learner_.phase() != StepLearner::Phase::kLearning) return;
  if (!stream_known_) {
    stream_ = stream;
    stream_known_ = true;
  }
  if (stream != stream_) return;
  if (const std::uint64_t record = learner_.record_malloc(rounded);
      record != StepLearner::kNoRecord) {
    records_[&block] = record;
  }
  if (std::optional<StepLearner::Layout> layout = learner_.take_layout()) {
    // The arena opens where the layout's step starts (place).
    taken_layout_ = {layout->arena_bytes, layout->peak_live_bytes};
  }
}

void LearnedPlacement::note_free(const Block& block) {
  if (const auto found = records_.find(&block); found != records_.end()) {
    learner_.record_free(found->second);
    records_.erase(found);
  }
}

void LearnedPlacement::commit_served() {
  if (learner_.phase() == StepLearner::Phase::kPlaced) learner_.commit_entry();
}

void LearnedPlacement::give_up() {
  learner_.depart();
  dissolve();
}

void LearnedPlacement::drop() {
  if (learner_.phase() != StepLearner::Phase::kPlaced) return;
  dissolve();
  learner_.reset();
}

Block* LearnedPlacement::depart() {
  learner_.depart();
  dissolve();
  return nullptr;
}

Block* LearnedPlacement::place(std::size_t rounded, Stream stream, std::uint64_t context,
                               bool& commit_when_served) {
  commit_when_served = false;
  if (learner_.phase() != StepLearner::Phase::kPlaced || stream != stream_) return nullptr;
  const StepLearner::LayoutEntry* next = learner_.peek_entry(rounded);
  if (next == nullptr) {
    dissolve();  // a request the layout did not foresee
    return nullptr;
  }
  // The step starts here: the arena opens with the fewest bytes live.
  if (arena_segment_ == nullptr && !learner_.waiting() && !open_arena(stream, context)) {
    learner_.depart();
    return nullptr;
  }
  if (next->offset == StepLearner::kDynamic) {
    commit_when_served = true;  // served by the dynamic path; the layout moves on if it is
    return nullptr;
  }
  const std::size_t page = paged_.memory().page();
  const std::uintptr_t target = arena_segment_->base + next->offset;
  const std::uintptr_t end = target + rounded;
  FreeBlockIndex& index = arena_.cached(SizeClass::kLarge);  // the arena's one index
  // The laid-out range must be free: every block over it (mapped or a hole) is.
  Block* first = index.at_or_before(target);
  if (first == nullptr || first->address + first->size <= target) return depart();
  for (const Block* block = first; block != nullptr && block->address < end; block = block->next) {
    if (block->state != BlockState::kFree) return depart();
  }
  // (The arena is mapped whole when it opens; this maps only what a failed map left out.)
  if (arena_segment_->pages->mapped * page < arena_segment_->size &&
      !map_range(round_down(target, page), round_up(end, page), context)) {
    return depart();
  }
  // Mapped and free, the range now lies in one cached block (free neighbours coalesce).
  Block* block = index.at_or_before(target);
  STOWAGE_INTERNAL_ASSERT(block != nullptr && block->mapped && block->state == BlockState::kFree &&
                              block->address + block->size >= end,
                          "the laid-out range at ", target, " is not one free mapped block");
  block = cut(block, target, rounded);
  if (block == nullptr) return depart();
  learner_.commit_entry();
  ++placed_allocations_;
  return block;
}

Block* LearnedPlacement::cut(Block* block, std::uintptr_t target, std::size_t rounded) {
  Block* spares[2] = {nullptr, nullptr};
  try {
    if (block->address < target) spares[0] = cache_.acquire_block();
    if (block->address + block->size > target + rounded) spares[1] = cache_.acquire_block();
  } catch (const std::bad_alloc&) {
    if (spares[0] != nullptr) cache_.recycle_block(spares[0]);
    return nullptr;
  }
  cache_.unindex(*block);
  if (spares[0] != nullptr) {
    BlockCache::split_after(block, target - block->address, spares[0]);
    cache_.index(*block);
    block = spares[0];
  }
  if (spares[1] != nullptr) {
    BlockCache::split_after(block, rounded, spares[1]);
    cache_.index(*spares[1]);
  }
  return block;
}

bool LearnedPlacement::open_arena(Stream stream, std::uint64_t context) {
  PagedMemory& memory = paged_.memory();
  const std::size_t size = round_up(std::max<std::size_t>(taken_layout_.arena_bytes, 1),
                                    memory.page());
  Block* hole = nullptr;
  try {
    hole = memory.reserve(arena_, SizeClass::kLarge, stream, size, context);
  } catch (const std::exception& error) {
    log_warning(detail::concat("no memory to record a step layout (", error.what(),
                               "); allocations stay dynamic"));
    return false;
  }
  if (hole == nullptr) return false;  // the device refused the address space (logged)
  arena_segment_ = hole->segment;
  // The arena's pages are better new than stitched from the shared pool, whose free pages are
  // mostly shared with live blocks: give back every whole free page now (once per layout), then
  // map the whole arena, before the next step's requests compete for the budget.
  paged_.release_cached();
  if (!map_range(arena_segment_->base, arena_segment_->base + size, context)) {
    dissolve();
    return false;
  }
  return true;
}

void LearnedPlacement::dissolve() {
  if (arena_segment_ == nullptr) return;
  // The arena becomes one more reservation of the shared pool: its free blocks are cache and
  // holes like any other, its live blocks stay where they are.
  std::vector<Block*> free_blocks;
  arena_.cached(SizeClass::kLarge).for_each([&](const Block& block) {
    free_blocks.push_back(const_cast<Block*>(&block));
  });
  for (Block* block : free_blocks) cache_.unindex(*block);
  arena_segment_->pool = &shared_;
  --arena_.segments;
  ++shared_.segments;
  arena_segment_ = nullptr;
  for (Block* block : free_blocks) cache_.index(*block);
}

bool LearnedPlacement::map_range(std::uintptr_t first, std::uintptr_t last,
                                 std::uint64_t context) {
  PagedMemory& memory = paged_.memory();
  FreeBlockIndex& index = arena_.cached(SizeClass::kLarge);
  for (;;) {
    // The lowest hole that meets [first, last).
    Block* hole = nullptr;
    Block* block = index.at_or_before(first);
    if (block == nullptr) block = arena_segment_->first;
    for (; block != nullptr && block->address < last; block = block->next) {
      if (block->state == BlockState::kFree && !block->mapped &&
          block->address + block->size > first) {
        hole = block;
        break;
      }
    }
    if (hole == nullptr) return true;
    const std::uintptr_t from = std::max(hole->address, first);
    const std::uintptr_t to = std::min(hole->address + hole->size, last);
    const std::size_t pages = (to - from) / memory.page();
    std::vector<PhysicalHandle> handles;
    handles.reserve(pages);
    if (!paged_.stitcher().gather(pages, to - from, nullptr, /*capturing=*/false, handles)) {
      memory.release_pages(handles);
      return false;
    }
    if (handles.size() > pages) {
      // Stitching took whole blocks: the pages beyond the range go back to the device.
      std::vector<PhysicalHandle> surplus(handles.begin() + static_cast<std::ptrdiff_t>(pages),
                                          handles.end());
      handles.resize(pages);
      memory.release_pages(surplus);
    }
    Block* rest = nullptr;
    if (from > hole->address) {
      try {
        rest = cache_.acquire_block();
      } catch (const std::bad_alloc&) {
        memory.release_pages(handles);
        return false;
      }
      // The hole before the range stays a hole; the range starts a hole of its own.
      cache_.unindex(*hole);
      BlockCache::split_after(hole, from - hole->address, rest);
      cache_.index(*hole);
      cache_.index(*rest);
      hole = rest;
    }
    const bool usable = memory.map(from, handles);
    if (!handles.empty()) memory.adopt(hole, handles, context);
    if (!usable) {
      if (handles.empty() && rest != nullptr) {
        // Nothing was mapped: the two holes become one again.
        cache_.unindex(*rest);
        cache_.insert_free(rest);
      }
      return false;
    }
  }
}

void LearnedPlacement::check_invariants() const {
  STOWAGE_INTERNAL_ASSERT(arena_.segments == (arena_segment_ != nullptr ? 1U : 0U),
                          "the arena's pool owns ", arena_.segments, " segments");
  STOWAGE_INTERNAL_ASSERT(arena_segment_ == nullptr || arena_segment_->pool == &arena_,
                          "the layout's arena is not in the arena's pool");
}

}  // namespace stowage
