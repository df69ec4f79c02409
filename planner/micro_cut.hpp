// How stowage.fit cuts a global batch into micro-batches (Note [Micro-batches] in
// python/stowage/fitting/micro_batches.py): the example's `rows` as `count` near-equal
// micro-batches (sizes differ by at most one; `count` need not divide the rows); a larger batch as
// more, none over `most` (the rows the plan is for); a smaller one as up to `count`, none under
// kMinRows rows (a single row broadcasts where more do not, so its ops differ from the trace's).
//
// Contract: a value type; every function is pure.
#pragma once

#include <cstdint>
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

  // How many micro-batches a batch of `batch_rows` runs as.
  std::int64_t count_at(std::int64_t batch_rows) const;
  // The micro-batches' first rows, and `batch_rows` last.
  std::vector<std::int64_t> bounds(std::int64_t batch_rows) const;

  friend bool operator==(const MicroCut&, const MicroCut&) = default;
};

}  // namespace stowage::planner
