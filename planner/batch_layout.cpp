#include "planner/batch_layout.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace stowage::planner {

BatchLayout batch_layout(const std::vector<BatchTensor>& tensors) {
  std::vector<const BatchTensor*> leaves;
  for (const BatchTensor& tensor : tensors) {
    if (!tensor.shape.empty()) leaves.push_back(&tensor);
  }
  if (leaves.empty()) throw std::invalid_argument("stowage.fit: the example batch holds no tensor with a batch dimension");
  std::set<std::int64_t> firsts;
  for (const BatchTensor* leaf : leaves) {
    if (leaf->shape[0] != 1) firsts.insert(leaf->shape[0]);
  }
  if (firsts.size() > 1) {
    std::string said;
    for (std::size_t i = 0; i < std::min<std::size_t>(leaves.size(), 6); ++i) {
      said += (i > 0 ? ", " : "") + leaves[i]->path + " has " + std::to_string(leaves[i]->shape[0]);
    }
    throw std::invalid_argument(
        "stowage.fit: the batch's tensors disagree on its rows (their first dimension): " + said +
        ". Every tensor has the batch's rows first, or 1 when every row shares it (position_ids of [1, S]); pass "
        "what is not per row (a class-weight table, a lookup) through loss_fn instead of the batch");
  }
  BatchLayout layout;
  layout.rows = firsts.empty() ? 1 : *firsts.begin();
  for (const BatchTensor* leaf : leaves) {
    if (!layout.seq && leaf->integer && leaf->shape.size() >= 2) layout.seq = leaf->shape[1];
    if (leaf->shape[0] == layout.rows) layout.per_row.push_back(leaf->path);
  }
  return layout;
}

}  // namespace stowage::planner
