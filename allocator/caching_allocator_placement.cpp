// The caching allocator's learned placement: the plan's arena, planned requests cut out of it,
// and the return to the dynamic path (Note [Learned placement] in caching_allocator.hpp).
#include <algorithm>
#include <exception>

#include "allocator/base/byte_units.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/base/errors.hpp"
#include "allocator/base/log.hpp"

namespace stowage {

namespace {

std::size_t round_down(std::size_t value, std::size_t multiple) { return value - value % multiple; }

}  // namespace

void CachingAllocator::mark_step() {
  const std::uint64_t context = context_for_history();
  std::lock_guard lock(mutex_);
  record_locked(TraceAction::kMarkStep, 0, 0, Stream{}, context);
  if (!learned_placement_) return;
  if (learner_.mark_step()) {
    dissolve_arena_locked();
  } else if (std::optional<StepLearner::Plan> plan = learner_.take_plan()) {
    taken_plan_ = {plan->arena_bytes, plan->peak_live_bytes};
  }
}

CachingAllocator::PlacementStatus CachingAllocator::placement_status() const {
  std::lock_guard lock(mutex_);
  PlacementStatus status;
  status.enabled = learned_placement_;
  status.phase = learner_.phase();
  status.plans_made = learner_.plans_made();
  status.departures = learner_.departures();
  status.arena_bytes = arena_segment_ != nullptr ? arena_segment_->size : 0;
  status.plan_live_bytes = arena_segment_ != nullptr ? taken_plan_.live_bytes : 0;
  status.planned_allocations = planned_allocations_;
  return status;
}

void CachingAllocator::learn_malloc_locked(Block* block, std::size_t rounded, Stream stream) {
  if (learner_.phase() != StepLearner::Phase::kLearning) return;
  if (!learned_stream_known_) {
    learned_stream_ = stream;
    learned_stream_known_ = true;
  }
  if (stream != learned_stream_) return;
  block->learned_record = learner_.record_malloc(rounded);
  if (std::optional<StepLearner::Plan> plan = learner_.take_plan()) {
    // The arena opens where the plan's step starts (place_planned_locked).
    taken_plan_ = {plan->arena_bytes, plan->peak_live_bytes};
  }
}

bool CachingAllocator::open_arena_locked(Stream stream, std::uint64_t context) {
  const std::size_t size = round_up(std::max<std::size_t>(taken_plan_.arena_bytes, 1), page_);
  void* base = nullptr;
  try {
    base = backend_.reserve_address_range(size, page_);
  } catch (const std::exception& error) {
    log_warning(detail::concat("reserving ", format_bytes(size),
                               " of device address space for a placement plan failed (",
                               error.what(), "); allocations stay dynamic"));
    return false;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  Block* hole = nullptr;
  try {
    hole = add_segment_locked(start, size, stream, Pool::kLarge, context, /*paged=*/true);
    if (std::find(paged_streams_.begin(), paged_streams_.end(), stream) == paged_streams_.end()) {
      paged_streams_.push_back(stream);
    }
  } catch (const std::exception& error) {
    if (hole != nullptr) {
      arena_.recycle(hole);
      segments_.erase(start);
    }
    backend_.release_address_range(base, size);
    log_warning(detail::concat("no memory to record a placement plan (", error.what(),
                               "); allocations stay dynamic"));
    return false;
  }
  hole->segment->planned = true;
  arena_segment_ = hole->segment;
  plan_arena_.insert(*hole);
  stats_.segment.update(Pool::kLarge, 1);
  // The arena's pages are better new than stitched from the dynamic cache, whose free pages are
  // mostly shared with live blocks: give back every whole free page now (once per plan), then
  // map the whole arena, before the next step's requests compete for the headroom.
  release_paged_locked();
  if (!map_arena_range_locked(start, start + size, context)) {
    dissolve_arena_locked();
    return false;
  }
  return true;
}

void CachingAllocator::dissolve_arena_locked() {
  if (arena_segment_ == nullptr) return;
  std::vector<Block*> free_blocks;
  free_blocks.reserve(plan_arena_.size());
  plan_arena_.for_each([&](const Block& block) { free_blocks.push_back(const_cast<Block*>(&block)); });
  for (Block* block : free_blocks) plan_arena_.erase(*block);
  arena_segment_->planned = false;
  arena_segment_ = nullptr;
  // The arena becomes one more reservation of the stream: its free blocks are cache and holes
  // like any other, its live blocks stay where they are.
  for (Block* block : free_blocks) index_for(*block).insert(*block);
}

Block* CachingAllocator::place_planned_locked(std::size_t rounded, Stream stream,
                                              std::uint64_t context, bool& commit_when_served) {
  commit_when_served = false;
  if (learner_.phase() != StepLearner::Phase::kPlaced || stream != learned_stream_) return nullptr;
  const StepLearner::PlannedAllocation* next = learner_.peek_planned(rounded);
  if (next == nullptr) {
    dissolve_arena_locked();  // a request the plan did not foresee
    return nullptr;
  }
  // The step starts here: the arena opens with the fewest bytes live.
  if (arena_segment_ == nullptr && !learner_.waiting() && !open_arena_locked(stream, context)) {
    learner_.depart();
    return nullptr;
  }
  if (next->offset == StepLearner::kDynamic) {
    commit_when_served = true;  // served by the dynamic path; the plan moves on if it is
    return nullptr;
  }
  const std::uintptr_t target = arena_segment_->base + next->offset;
  const std::uintptr_t end = target + rounded;
  auto depart = [&]() -> Block* {
    learner_.depart();
    dissolve_arena_locked();
    return nullptr;
  };
  // The planned range must be free: every block over it (mapped or a hole) is.
  Block* first = plan_arena_.at_or_before(target);
  if (first == nullptr || first->address + first->size <= target) return depart();
  for (const Block* block = first; block != nullptr && block->address < end; block = block->next) {
    if (block->state != BlockState::kFree) return depart();
  }
  // (The arena is mapped whole when it opens; this maps only what a failed map left out.)
  if (arena_segment_->mapped_pages * page_ < arena_segment_->size &&
      !map_arena_range_locked(round_down(target, page_), round_up(end, page_), context)) {
    return depart();
  }
  // Mapped and free, the range now lies in one cached block (free neighbours coalesce).
  Block* block = plan_arena_.at_or_before(target);
  STOWAGE_INTERNAL_ASSERT(block != nullptr && block->mapped && block->state == BlockState::kFree &&
                              block->address + block->size >= end,
                          "the planned range at ", target, " is not one free mapped block");
  Block* spares[2] = {nullptr, nullptr};
  try {
    if (block->address < target) spares[0] = arena_.acquire();
    if (block->address + block->size > end) spares[1] = arena_.acquire();
  } catch (const std::bad_alloc&) {
    if (spares[0] != nullptr) arena_.recycle(spares[0]);
    return depart();
  }
  count_inactive_split_locked(*block, -1);
  plan_arena_.erase(*block);
  if (spares[0] != nullptr) {
    split_after_locked(block, target - block->address, spares[0]);
    plan_arena_.insert(*block);
    count_inactive_split_locked(*block, 1);
    block = spares[0];
  }
  if (spares[1] != nullptr) {
    split_after_locked(block, rounded, spares[1]);
    plan_arena_.insert(*spares[1]);
    count_inactive_split_locked(*spares[1], 1);
  }
  learner_.commit_planned();
  ++planned_allocations_;
  return block;
}

bool CachingAllocator::map_arena_range_locked(std::uintptr_t first, std::uintptr_t last,
                                              std::uint64_t context) {
  for (;;) {
    // The lowest hole that meets [first, last).
    Block* hole = nullptr;
    Block* block = plan_arena_.at_or_before(first);
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
    const std::size_t pages = (to - from) / page_;
    std::vector<PhysicalHandle> handles;
    handles.reserve(pages);
    if (!gather_pages_locked(pages, to - from, nullptr, handles)) {
      release_pages_locked(handles);
      return false;
    }
    if (handles.size() > pages) {
      // Stitching took whole blocks: the pages beyond the range go back to the device.
      std::vector<PhysicalHandle> surplus(handles.begin() + static_cast<std::ptrdiff_t>(pages),
                                          handles.end());
      handles.resize(pages);
      release_pages_locked(surplus);
    }
    Block* rest = nullptr;
    if (from > hole->address) {
      try {
        rest = arena_.acquire();
      } catch (const std::bad_alloc&) {
        release_pages_locked(handles);
        return false;
      }
      // The hole before the range stays a hole; the range starts a hole of its own.
      plan_arena_.erase(*hole);
      split_after_locked(hole, from - hole->address, rest);
      plan_arena_.insert(*hole);
      plan_arena_.insert(*rest);
      hole = rest;
    }
    const bool usable = map_pages_locked(from, handles);
    if (!handles.empty()) adopt_mapped_pages_locked(hole, handles, context);
    if (!usable) {
      if (handles.empty() && rest != nullptr) {
        // Nothing was mapped: the two holes become one again.
        plan_arena_.erase(*rest);
        insert_free_locked(rest);
      }
      return false;
    }
  }
}

}  // namespace stowage
