#include "python/tensors/saved_version.hpp"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>

#include <sstream>

namespace stowage::torch_offload {

namespace {

std::string describe(const at::Tensor& tensor) {
  std::ostringstream text;
  // torch's legacy type name, as its message gives it: torch.FloatTensor, torch.cuda.BFloat16Tensor
  text << "[torch." << (tensor.is_cuda() ? "cuda." : "") << c10::toString(tensor.scalar_type()) << "Tensor "
       << tensor.sizes() << "]";
  if (const auto& producer = tensor.grad_fn()) {
    text << ", which is output " << tensor.output_nr() << " of " << producer->name();
  }
  return text.str();
}

}  // namespace

SavedVersion::SavedVersion(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.is_inference()) return;  // no counter to follow
  counter_ = tensor.unsafeGetTensorImpl()->version_counter();
  saved_ = counter_.enabled() ? counter_.current_version() : 0;
  description_ = describe(tensor);
}

bool SavedVersion::intact() const noexcept {
  return !counter_.enabled() || counter_.current_version() == saved_;
}

void SavedVersion::check() const {
  if (!counter_.enabled()) return;
  const std::uint32_t now = counter_.current_version();
  TORCH_CHECK(now == saved_,
              "one of the variables needed for gradient computation has been modified by an inplace "
              "operation: ", description_, ", is at version ", now, "; expected version ", saved_,
              " instead. (Saved under stowage's saved-tensor hooks, which check versions as torch does.) "
              "Hint: enable anomaly detection to find the operation that failed to compute its gradient, "
              "with torch.autograd.set_detect_anomaly(True, check_nan=False).");
}

}  // namespace stowage::torch_offload
