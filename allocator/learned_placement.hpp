// LearnedPlacement: learned addresses for a repeating training step, consulted before the
// allocator's dynamic path (placement:learned, paged path only).
//
// Note [Learned placement]
// Training repeats the same allocations every step. A StepLearner (step_learner.hpp) watches the
// large class's requests on one stream until a step has repeated (stowage.mark_step() marks steps;
// without marks the repetition is found in the sequence), and lays out every allocation of the
// step that lives less than a step: a step layout (step_layout.hpp), the offset in an arena of
// each such request, packed from their recorded lifetimes. The layout's step starts at the mark,
// or (found without marks) after the point with the fewest bytes live, where a step boundary lies;
// requests before it stay dynamic. There the layout gets an arena: an address reservation of its
// own, a pool whose free blocks are kept apart from the shared pool, in one index by address. The
// shared pool gives its whole free pages back and the arena is mapped whole (new pages within the
// budget, else stitched, as on a miss), so nothing is mapped twice over and no page moves
// afterwards. From then on the k-th request of the step is cut out of the arena at the layout's
// offset. Requests the layout leaves dynamic (long-lived ones) take the dynamic path. The moment a
// request differs from the layout (another size, a step marked early) or its laid-out range is not
// free (a free came later than recorded, a record_stream still pending), the layout is dropped:
// the arena's free blocks join the shared pool, its live blocks stay where they are, and learning
// starts again. empty_cache drops the layout too. The learner bounds what it keeps and stops after
// repeated departures.
//
// Contract: not thread-safe (the allocator's lock guards it). Owns the learner and the arena's
// pool; the arena's segment and blocks are the BlockCache's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <unordered_map>

#include "allocator/block_cache.hpp"
#include "allocator/paged_source.hpp"
#include "allocator/pool.hpp"
#include "allocator/step_learner.hpp"

namespace stowage {

class LearnedPlacement {
 public:
  struct Status {
    bool enabled = false;  // placement:learned on the paged path
    StepLearner::Phase phase = StepLearner::Phase::kLearning;
    std::size_t layouts_made = 0;
    int departures = 0;
    std::size_t arena_bytes = 0;         // the arena of the layout in force (0: none)
    std::size_t layout_live_bytes = 0;   // its allocations' most bytes live at once
    std::size_t placed_allocations = 0;  // requests served at the layout's offset, ever
  };

  LearnedPlacement(BlockCache& cache, PagedSource& paged, Pool& shared);

  // The end of a training step.
  void mark_step();
  Status status() const;

  // The block the layout gives a request of the large class, claimed from the arena, or nullptr:
  // then `commit_when_served` says whether the dynamic path serves a request the layout expects
  // (call commit_served once it has).
  Block* place(std::size_t rounded, Stream stream, std::uint64_t context,
               bool& commit_when_served);
  void commit_served();
  // Records a request the allocator served (while learning).
  void learn(const Block& block, std::size_t rounded, Stream stream);
  // Records the free of an allocated block (before the cache ends its allocation).
  void note_free(const Block& block);

  // Whether an arena holds memory the dynamic path cannot reach.
  bool has_arena() const noexcept { return arena_segment_ != nullptr; }
  // Leaves the layout: its arena joins the shared pool (a miss the dynamic path could not serve).
  void give_up();
  // Drops the layout in force and learns again (empty_cache).
  void drop();

  const Pool& arena_pool() const noexcept { return arena_; }
  // Throws InternalError if the arena's bookkeeping is broken.
  void check_invariants() const;

 private:
  // Opens the arena of the layout taken; false (nothing kept) if it cannot.
  bool open_arena(Stream stream, std::uint64_t context);
  void dissolve();
  // Maps the unmapped pages of the arena in [first, last) (page-aligned); false if it could not.
  bool map_range(std::uintptr_t first, std::uintptr_t last, std::uint64_t context);
  // Cuts [target, target + rounded) out of the arena's free mapped block `block`, which holds
  // it; nullptr (the layout left) when no record can be had for the cut.
  Block* cut(Block* block, std::uintptr_t target, std::size_t rounded);
  // The layout could not be followed: learn again, with the arena dissolved.
  Block* depart();

  BlockCache& cache_;
  PagedSource& paged_;
  Pool& shared_;
  StepLearner learner_;
  bool stream_known_ = false;
  Stream stream_;  // the one stream the learner follows
  Pool arena_{kSharedPoolId, Pool::Order::kAddress};
  Segment* arena_segment_ = nullptr;  // while a layout is in force
  struct TakenLayout {
    std::size_t arena_bytes = 0;
    std::size_t live_bytes = 0;  // its allocations' most bytes live at once
  };
  TakenLayout taken_layout_;  // the layout the learner is following (its arena may not be open yet)
  std::size_t placed_allocations_ = 0;
  // The learner's record of each allocated block it follows; its nodes come from a pool, so
  // recording a request does not call the heap.
  std::pmr::unsynchronized_pool_resource record_nodes_;
  std::pmr::unordered_map<const Block*, std::uint64_t> records_{&record_nodes_};
};

}  // namespace stowage
