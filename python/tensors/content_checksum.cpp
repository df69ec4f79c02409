#include "python/tensors/content_checksum.hpp"

#include <ATen/ops/arange.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <array>
#include <cstdint>

#include "base/errors.hpp"

namespace stowage::torch_offload {

namespace {

constexpr std::int64_t kRowWords = 1024;

// The tensor's bytes as a flat tensor of words (see the header): the same words for the same bytes
// wherever they lie (an unaligned start is copied to an aligned one first), without a copy where
// the layout allows one view.
at::Tensor words_of(const at::Tensor& tensor) {
  at::Tensor flat = tensor.detach().contiguous().view(-1);
  const std::int64_t bytes = flat.numel() * static_cast<std::int64_t>(flat.element_size());
  if (flat.element_size() == 8) return flat.view(at::kLong);
  if (bytes % 4 != 0) {  // an odd count of 2-byte elements, or bytes: each widened to a word
    return (flat.element_size() == 2 ? flat.view(at::kShort) : flat.view(at::kByte)).to(at::kInt);
  }
  if (reinterpret_cast<std::uintptr_t>(flat.const_data_ptr()) % 4 != 0) flat = flat.clone();
  return flat.view(at::kInt);
}

// sum(values * (first, first + 1, ...)) in int64, wrapping.
at::Tensor weighted_sum(const at::Tensor& values, std::int64_t first) {
  const at::Tensor weights =
      at::arange(first, first + values.numel(), at::TensorOptions().dtype(at::kLong).device(values.device()));
  return values.to(at::kLong).mul(weights).sum();
}

// The same three sums as the reductions below, for 32-bit words in host memory, in one pass:
// ATen's integer reductions on a CPU run far below memory bandwidth, and a pass here does not.
// Unsigned arithmetic wraps as the reductions' integer sums do, so the values are the same.
at::Tensor checksum_on_host(const std::int32_t* words, std::int64_t count) {
  const std::int64_t rows = count / kRowWords;
  std::array<std::uint32_t, kRowWords> columns{};
  std::uint64_t total = 0, by_row = 0, by_column = 0;
  const auto widen = [](std::uint32_t x) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(x))); };
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t* row = words + r * kRowWords;
    std::uint32_t row_sum = 0;
    for (std::int64_t c = 0; c < kRowWords; ++c) {
      const auto x = static_cast<std::uint32_t>(row[c]);
      row_sum += x;
      columns[static_cast<std::size_t>(c)] += x;
    }
    total += widen(row_sum);
    by_row += static_cast<std::uint64_t>(r + 1) * widen(row_sum);
  }
  for (std::int64_t c = 0; c < kRowWords && rows > 0; ++c) {
    by_column += static_cast<std::uint64_t>(c + 1) * widen(columns[static_cast<std::size_t>(c)]);
  }
  for (std::int64_t i = rows * kRowWords; i < count; ++i) {
    const std::uint64_t x = widen(static_cast<std::uint32_t>(words[i]));
    const auto position = static_cast<std::uint64_t>(i - rows * kRowWords);
    total += x;
    by_row += (static_cast<std::uint64_t>(rows) + 1 + position) * x;
    by_column += (1 + position) * x;
  }
  return at::tensor({static_cast<std::int64_t>(total), static_cast<std::int64_t>(by_row),
                     static_cast<std::int64_t>(by_column)}, at::TensorOptions().dtype(at::kLong));
}

at::Tensor checksum_of(const at::Tensor& tensor) {
  const auto options = at::TensorOptions().dtype(at::kLong).device(tensor.device());
  if (tensor.numel() == 0) return at::zeros({kChecksumWidth}, options);
  const at::Tensor words = words_of(tensor);
  if (words.device().is_cpu() && words.scalar_type() == at::kInt) {
    return checksum_on_host(words.const_data_ptr<std::int32_t>(), words.numel());
  }
  const at::ScalarType word = words.scalar_type();
  const std::int64_t rows = words.numel() / kRowWords;
  const at::Tensor tail = words.narrow(0, rows * kRowWords, words.numel() - rows * kRowWords);
  at::Tensor total = tail.sum(at::kLong);
  at::Tensor by_row = weighted_sum(tail, rows + 1);
  at::Tensor by_column = weighted_sum(tail, 1);
  if (rows > 0) {
    const at::Tensor grid = words.narrow(0, 0, rows * kRowWords).view({rows, kRowWords});
    const at::Tensor row_sums = grid.sum(1, false, word);
    total = total.add(row_sums.sum(at::kLong));
    by_row = by_row.add(weighted_sum(row_sums, 1));
    by_column = by_column.add(weighted_sum(grid.sum(0, false, word), 1));
  }
  return at::stack({total, by_row, by_column});
}

}  // namespace

at::Tensor content_checksums(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::zeros({0, kChecksumWidth}, at::TensorOptions().dtype(at::kLong));
  std::vector<at::Tensor> sums;
  sums.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    STOWAGE_CHECK(tensor.defined() && tensor.has_storage(), "a content checksum needs a dense tensor");
    STOWAGE_CHECK(tensor.device() == tensors.front().device(), "content checksums take tensors on one device, not ",
                  tensors.front().device().str(), " and ", tensor.device().str());
    sums.push_back(checksum_of(tensor));
  }
  return at::stack(sums);
}

}  // namespace stowage::torch_offload
