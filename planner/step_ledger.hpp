// The storages of a step as it is recorded: which op made each, its last forward use, which were
// saved for backward, and when backward took them back (Note [Keeping the ledger]). The
// recorder (stowage.plan.recording) sees torch's ops and saved-tensor hooks and reports them
// here by storage key; `recording()` hands the step to the trace builder (trace_builder.hpp).
//
// Note [Keeping the ledger]
// A storage is known by its key: its data address while it lives. An op made a storage when its
// output has that key (a view's output makes nothing: it shares its base's storage); in forward
// that op is the storage's producer and its last forward use so far; every later forward op
// taking it is its last forward use. A storage autograd saves is put in the ledger at its first
// save (later saves of it add their ops and regions). A saved storage taken by a backward op has
// that op as its last backward use; its first is the op count when backward first unpacked it.
// Parameters and buffers (`add_fixed`), and tensors without storage (key 0), are never the step's
// saved storages. A storage made outside the step's ops (a tensor lifted from a Python constant:
// `torch.tensor(...)`, an index given as a list) is new at its address too: what lived there
// before is forgotten, so it has no producer (like a tensor made before the step, no decision
// reaches it) rather than the producer of whatever freed storage the allocator placed there last,
// which would change with the sizes and the run. When an op after forward makes a storage at the address of a saved one, the
// saved one was freed: it moves to a key of its own (negative, never an address), with its
// producer, last forward use and the region inputs that named it, so that the uses of what lives
// at the address next are not counted as its uses. Storages are handed on in the order they were
// saved, a moved one after those saved before its move.
//
// Contract: one step, one thread; not thread safe. Keys are the caller's; indices of storages
// are stable for the ledger's life.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "planner/lifetime_trace.hpp"
#include "planner/trace_builder.hpp"

namespace stowage::planner {

inline const SaveSite kOutsideModules{"", -1, 0};

class StepLedger {
 public:
  using Key = std::int64_t;
  using Keys = std::vector<Key>;

  // A parameter's or buffer's storage: never saved by the step.
  void add_fixed(Key key) { fixed_.insert(key); }

  // The next op (its index is the number of ops reported before it) ran in `phase`, taking the
  // storages `used` and, unless it is a view, making `made`.
  void op_ran(Phase phase, const Keys& used, const Keys& made);

  // Storages `made` came into being in `phase` by no op of the step's (not counted as an op): a
  // tensor made outside the dispatcher and lifted into the step (aten::lift_fresh).
  void made_outside_ops(Phase phase, const Keys& made);

  // A checkpointable block begins; `inputs`: the storages of its tensor arguments (keys 0 and
  // fixed ones are dropped). Returns its region's index.
  std::int32_t enter_region(const Keys& inputs);

  // Whether an op of `region` wrote one of the region's inputs (`written`: the storages it wrote).
  [[nodiscard]] bool writes_input(std::int32_t region, const Keys& written) const;

  // Autograd saves `key` (of `bytes`) after the ops so far, in `region` (kNoRegion: none), at
  // `site` (call -1: outside any module). Returns the saved storage's index, or none for a fixed
  // storage or key 0 (no decision reaches those: their sites in a module are kept saves).
  std::optional<std::size_t> save(Key key, std::uint64_t bytes, std::int32_t region,
                                  const SaveSite& site = kOutsideModules);

  // Backward unpacked saved storage `storage`; the first time sets its first backward use.
  void taken_back(std::size_t storage);

  [[nodiscard]] std::size_t ops() const noexcept { return ops_; }

  // The saved storages' indices in the order recording() lists them.
  [[nodiscard]] std::vector<std::size_t> storage_order() const;

  // The step for build_trace: `ops` as recorded (one per op_ran), the regions' modules and
  // whether each may be checkpointed as recorded, with the ledger's storages and region inputs.
  // LogicError when `ops` or `regions` do not match what was reported.
  [[nodiscard]] StepRecording recording(std::vector<TraceOp> ops, std::vector<RecordedRegion> regions) const;

 private:
  struct Storage {
    Key key = 0;             // its address, or its own key once moved
    std::uint64_t order = 0;  // when it was saved or moved: recording() lists by it
    RecordedStorage recorded;
  };

  // `index`: the op that made it; none for a storage made outside the step's ops.
  void made(Key key, std::optional<std::size_t> index, Phase phase);
  void move_out(Key key);

  std::unordered_set<Key> fixed_;
  std::unordered_map<Key, std::size_t> producer_, last_forward_;
  std::unordered_map<Key, std::size_t> saved_;  // key -> index in storages_
  std::vector<Storage> storages_;
  std::vector<std::vector<Key>> region_inputs_;
  std::vector<SaveSite> fixed_saves_;
  std::size_t ops_ = 0;
  std::uint64_t next_order_ = 0;
  Key moved_ = 0;  // the last own key given (-1, -2, ...)
};

}  // namespace stowage::planner
