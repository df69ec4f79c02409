#include "python/tensors/content_watch.hpp"

#include <ATen/ops/any.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <chrono>

#include "base/errors.hpp"
#include "python/tensors/content_checksum.hpp"

namespace stowage::torch_offload {

namespace {

class Timer {
 public:
  explicit Timer(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Timer() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

ContentWatch::ContentWatch(const c10::Device& device)
    : device_(device), sums_(at::zeros({0, kChecksumWidth}, at::TensorOptions().dtype(at::kLong).device(device))) {}

void ContentWatch::extend(std::int64_t count) {
  STOWAGE_CHECK(count >= 0, "a content watch grows by ", count, " rows");
  sums_ = at::cat({sums_, at::zeros({count, kChecksumWidth}, sums_.options())});
}

at::Tensor ContentWatch::rows(const std::vector<std::int64_t>& indices) const {
  for (const std::int64_t index : indices) {
    STOWAGE_CHECK(index >= 0 && index < sums_.size(0), "content watch row ", index, " of ", sums_.size(0));
  }
  return at::tensor(indices, at::TensorOptions().dtype(at::kLong)).to(device_);
}

void ContentWatch::remember(const std::vector<std::int64_t>& indices, const std::vector<at::Tensor>& tensors) {
  if (indices.empty()) return;
  STOWAGE_CHECK(indices.size() == tensors.size(), indices.size(), " rows for ", tensors.size(), " tensors");
  const Timer timer(seconds_);
  sums_.index_copy_(0, rows(indices), content_checksums(tensors));
}

void ContentWatch::remember_one(std::int64_t index, const at::Tensor& tensor) {
  STOWAGE_CHECK(index >= 0 && index < sums_.size(0), "content watch row ", index, " of ", sums_.size(0));
  const Timer timer(seconds_);
  sums_.narrow(0, index, 1).copy_(content_checksums({tensor}));
}

std::vector<bool> ContentWatch::changed(const std::vector<std::int64_t>& indices,
                                        const std::vector<at::Tensor>& tensors) {
  if (indices.empty()) return {};
  STOWAGE_CHECK(indices.size() == tensors.size(), indices.size(), " rows for ", tensors.size(), " tensors");
  const Timer timer(seconds_);
  const at::Tensor differ = at::ne(content_checksums(tensors), sums_.index_select(0, rows(indices))).any(1).cpu();
  const bool* flags = differ.const_data_ptr<bool>();
  return std::vector<bool>(flags, flags + differ.numel());
}

}  // namespace stowage::torch_offload
