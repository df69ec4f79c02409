// A batch's shape as stowage.fit reads it (README's "A global batch as micro-batches"), from its
// tensors of one or more dimensions: its rows, the first dimension, which every tensor has or has
// as 1 (shared by every row, never cut); its sequence length, the second dimension of its first
// integer tensor of two or more (token ids; a float input's second is features or channels, never
// cut); and the tensors cut with the rows. Python reads the tensors' paths and shapes and cuts them.
//
// Contract: pure functions; a batch fit cannot read throws std::invalid_argument (Python's
// ValueError) naming its tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stowage::planner {

// One tensor of a batch: its path as a user writes it (batch['labels']), its shape, whether it
// holds integers (not floating point or complex).
struct BatchTensor {
  std::string path;
  std::vector<std::int64_t> shape;
  bool integer = false;
};

struct BatchLayout {
  std::int64_t rows = 1;
  std::optional<std::int64_t> seq;  // nullopt: no integer tensor of two or more dimensions
  std::vector<std::string> per_row;  // the paths of the tensors cut with the rows
};

// The layout of a batch of `tensors` (those of no dimension are ignored).
BatchLayout batch_layout(const std::vector<BatchTensor>& tensors);

}  // namespace stowage::planner
