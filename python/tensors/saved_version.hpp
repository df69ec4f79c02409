// SavedVersion: the in-place check torch makes on the tensors it saves for backward, for the
// tensors stowage's saved-tensor hooks hold instead.
//
// torch checks, when backward unpacks a saved tensor, that it was not changed in place since it
// was saved, and raises its "modified by an inplace operation" error otherwise; for tensors
// handed to saved-tensor hooks it checks nothing, so the hooks must. A SavedVersion holds the
// tensor's version counter (shared with the tensor and all its views, and nothing else: not its
// storage, which an offloaded tensor must let go) and the count when it was saved.
//
// Contract: made at pack on the thread that saves; check() from any of autograd's threads (the
// counter is atomic). Copies share the counter.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <string>

namespace stowage::torch_offload {

class SavedVersion {
 public:
  SavedVersion() = default;
  // The version of `tensor` now, as autograd saves it.
  explicit SavedVersion(const at::Tensor& tensor);

  // Throws c10::Error with torch's message when the tensor was changed in place since.
  void check() const;
  // Whether the tensor is at the version it was saved at.
  bool intact() const noexcept;

 private:
  c10::VariableVersion counter_;
  std::uint32_t saved_ = 0;
  std::string description_;  // "[torch.FloatTensor [2, 3]], which is output 0 of SigmoidBackward0"
};

}  // namespace stowage::torch_offload
