// torch's stack contexts behind the allocator's context handles.
//
// The allocator tags blocks and history events with a 64-bit handle from its context provider;
// torch's history (torch.cuda.memory._record_memory_history) hands over a function that gathers
// a context (a CapturedTraceback) for each event, and wants those contexts back in snapshots.
// This table holds them: intern() stores one and returns its handle, find() gives it back.
//
// Bounded: once the table outgrows twice what can still be referred to (the history's length
// plus the live blocks), the handles no event or block refers to any more are dropped
// (prune()); so a long run with history on keeps memory proportional to the history.
//
// Contract: thread-safe; intern() is called before the allocator takes its lock (Note [Stacks
// before the lock]), prune() with no allocator lock held.
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace stowage::torch_cuda {

class GatheredContexts {
 public:
  using Context = std::shared_ptr<c10::GatheredContext>;

  // Returns the handle for `context` (0 for none).
  std::uint64_t intern(Context context);
  Context find(std::uint64_t handle) const;
  // Whether the table has grown enough to be worth pruning.
  bool wants_pruning() const;
  // Keeps only the handles in `referenced`.
  void prune(const std::unordered_set<std::uint64_t>& referenced);
  void clear();

 private:
  mutable std::mutex mutex_;
  std::uint64_t next_ = 1;
  std::size_t prune_at_ = 1 << 16;
  std::unordered_map<std::uint64_t, Context> contexts_;
};

}  // namespace stowage::torch_cuda
