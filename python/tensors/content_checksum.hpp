// Content checksums: a few 64-bit sums over a tensor's bytes, computed where the tensor lives
// (ATen reductions: on its device, in its current stream's order), so that a change to the
// bytes can be seen without copying them anywhere.
//
// The bytes are read as 32-bit words (64-bit for 8-byte elements; 16-bit words widened when a
// tensor's bytes are not whole 32-bit words) laid out in rows of kRowWords. Three sums, each
// wrapping (integer sums are exact and order-free, so the result does not depend on how the
// reduction is split over threads or blocks): all words; the row sums weighted by row number;
// the column sums weighted by column number. Any change to one word changes the first; moving
// words between rows or between columns (a permutation, a swap) changes the second or third.
// Equal bytes always give equal sums; different bytes give equal sums only by a coincidence of
// about one in 2^32 for the changes training code makes.
//
// Temporary memory: one word per row and one per column (1/1024 of the tensor), besides a
// contiguous copy for a tensor that is not contiguous. In host memory (CPU tensors, CPU mode's
// device) one loop computes the same sums in one pass.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace stowage::torch_offload {

inline constexpr std::int64_t kChecksumWidth = 3;

// [tensors.size(), kChecksumWidth] int64 on the tensors' device (all on one); an empty list gives
// an empty CPU tensor. Runs on the current stream.
at::Tensor content_checksums(const std::vector<at::Tensor>& tensors);

}  // namespace stowage::torch_offload
