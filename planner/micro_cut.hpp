// How stowage.fit cuts a global batch into micro-batches: the example's `rows` as `count` near-equal
// micro-batches (sizes differ by at most one; `count` need not divide the rows); a larger batch as
// more, none over `most` (the rows the plan is for); a smaller one as up to `count`, none under
// kMinRows rows (a single row broadcasts where more do not, so its ops differ from the trace's).
//
// Note [Micro-batches]
// A step of k micro-batches runs, in order, forward and backward of each, its loss multiplied by
// its share of the global batch's loss units, gradients accumulating; then the optimizer's step:
// what torch computes for the same accumulation written by hand, bit for bit, and the global
// batch's step up to the rounding of a sum taken in pieces exactly when the global batch's loss is
// the micro-batches' losses weighted by those shares. fit never takes that on trust: it cuts only
// where the example batch's own losses verify it (planner/loss_units.hpp judges them; the forwards
// run in python/stowage/fitting/cut_check.py), on the finest cut it may take (row groups of
// kMinRows rows, at most kCheckGroups) and the one it takes; README's "A global batch as
// micro-batches" lists what keeps a batch whole. A micro-batch holding no units (every label
// ignored) is left out: it adds nothing to the global mean, where its own mean would be 0/0.
//
// Contract: a value type; every function is pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stowage::planner {

inline constexpr std::int64_t kMinRows = 2;
inline constexpr std::int64_t kCheckGroups = 32;  // the finest cut checked, in row groups

struct MicroCut {
  std::int64_t rows = 1;   // the example's rows
  std::int64_t count = 1;  // micro-batches the example runs as
  std::int64_t most = 1;   // rows of the largest micro-batch of any batch; at least ceil(rows / count)

  // The example's rows as `count` micro-batches of at most ceil(rows / count) rows.
  static MicroCut of(std::int64_t rows, std::int64_t count);
  // The finest cut fit checks: row groups of at least kMinRows rows, at most kCheckGroups.
  static MicroCut finest(std::int64_t rows);
  // The cut asked of an example of `rows` rows: `count`'s, run as asked (1: whole) or refused
  // (std::invalid_argument: no rows, a count under 1, micro-batches under kMinRows rows); nullopt
  // ("auto") where fit is to choose, whole where the rows are too few to cut.
  static std::optional<MicroCut> asked(std::int64_t rows, std::optional<std::int64_t> count);

  // How many micro-batches a batch of `batch_rows` runs as.
  std::int64_t count_at(std::int64_t batch_rows) const;
  // The micro-batches' first rows, and `batch_rows` last.
  std::vector<std::int64_t> bounds(std::int64_t batch_rows) const;

  friend bool operator==(const MicroCut&, const MicroCut&) = default;
};

// A grid of sizes fit records a step at when it does not fit whole: each size it varies ("batch",
// "seq") with its values; a size left out keeps the example's value at every point.
using RecordingGrid = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

// The grids to record a step at, nearest the example of `rows` rows and sequences of `seq` (0:
// none) first, the less a size is extrapolated the less it can miss: two small batch sizes
// (kMinRows and one more: one row broadcasts where more do not, so its ops differ), and three
// sequence lengths (attention is quadratic in them) from a half, a quarter, then an eighth of the
// example's up. Empty where the example is too small to record smaller (fewer than 3 rows and
// sequences under 24).
std::vector<RecordingGrid> recording_grids(std::int64_t rows, std::int64_t seq);

}  // namespace stowage::planner
