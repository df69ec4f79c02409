#include "python/bindings/torch/content_checksum.hpp"

#include <ATen/ops/arange.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include "allocator/base/errors.hpp"

namespace stowage::torch_offload {

namespace {

constexpr std::int64_t kRowWords = 1024;

// The tensor's bytes as a flat tensor of words (see the header), without a copy where the layout
// allows one view.
at::Tensor words_of(const at::Tensor& tensor) {
  const at::Tensor flat = tensor.detach().contiguous().view(-1);
  const std::int64_t bytes = flat.numel() * static_cast<std::int64_t>(flat.element_size());
  const bool aligned = reinterpret_cast<std::uintptr_t>(flat.const_data_ptr()) % 4 == 0;
  if (flat.element_size() == 8) return flat.view(at::kLong);
  if (bytes % 4 == 0 && aligned) return flat.view(at::kInt);
  if (flat.element_size() == 2) return flat.view(at::kShort).to(at::kInt);
  return flat.view(at::kByte).to(at::kInt);
}

// sum(values * (first, first + 1, ...)) in int64, wrapping.
at::Tensor weighted_sum(const at::Tensor& values, std::int64_t first) {
  const at::Tensor weights =
      at::arange(first, first + values.numel(), at::TensorOptions().dtype(at::kLong).device(values.device()));
  return values.to(at::kLong).mul(weights).sum();
}

at::Tensor checksum_of(const at::Tensor& tensor) {
  const auto options = at::TensorOptions().dtype(at::kLong).device(tensor.device());
  if (tensor.numel() == 0) return at::zeros({kChecksumWidth}, options);
  const at::Tensor words = words_of(tensor);
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
