// ContentWatch: seeing writes that leave no trace in a tensor's version. The bytes of a set of
// tensors, as content checksums (content_checksum.hpp), remembered at one point and compared at a
// later one.
//
// p.data.fill_(), p.data.clamp_() and p.grad.data.zero_() change a tensor without bumping the
// version autograd counts, so the offloaded optimizer cannot tell from versions that a parameter
// was written since it last wrote it back, or a gradient since it was copied out. The checksums
// are computed where the tensors live, in stream order; only the comparison's verdict, one flag a
// tensor, comes to the host.
//
// Contract: a watch has a number of rows (one per watched tensor, by index) grown by extend(); a
// row compared before anything was remembered in it compares against zeros. One thread at a time
// (the optimizer's lock).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace stowage::torch_offload {

class ContentWatch {
 public:
  explicit ContentWatch(const c10::Device& device);

  // Adds `count` rows.
  void extend(std::int64_t count);
  // Takes the tensors' bytes now as the ones rows `indices` stand for.
  void remember(const std::vector<std::int64_t>& indices, const std::vector<at::Tensor>& tensors);
  // The same for one row, without moving its index to the device (no sync: made as each
  // gradient is copied out, in stream order with that copy).
  void remember_one(std::int64_t index, const at::Tensor& tensor);
  // Whether each tensor's bytes differ from what its row remembers (one sync).
  std::vector<bool> changed(const std::vector<std::int64_t>& indices, const std::vector<at::Tensor>& tensors);
  // Host time spent here so far (on a GPU: issuing, and the verdicts' waits).
  double seconds() const noexcept { return seconds_; }

 private:
  at::Tensor rows(const std::vector<std::int64_t>& indices) const;

  c10::Device device_;
  at::Tensor sums_;  // [rows, kChecksumWidth] int64 on device_
  double seconds_ = 0.0;
};

}  // namespace stowage::torch_offload
