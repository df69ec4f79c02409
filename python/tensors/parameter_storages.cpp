#include "python/tensors/parameter_storages.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <array>
#include <string_view>

namespace stowage::torch_offload {

namespace {

// Registering prunes dead entries after this many additions, so the table tracks live storages.
constexpr std::size_t kPruneEvery = 4096;
// How many view and cast nodes a parameter's history may pass through.
constexpr int kMaxChain = 8;

// Backward nodes of ops that alias or cast their one input: a tensor whose history is only these
// holds its leaf's values, not a computation's.
bool is_view_or_cast(std::string_view name) {
  static constexpr std::array<std::string_view, 17> kNames = {
      "TBackward0",        "TransposeBackward0", "PermuteBackward0",   "ViewBackward0",
      "UnsafeViewBackward0", "ReshapeAliasBackward0", "ExpandBackward0", "UnsqueezeBackward0",
      "SqueezeBackward0",  "SqueezeBackward1",   "SliceBackward0",     "SelectBackward0",
      "AliasBackward0",    "AsStridedBackward0", "ToCopyBackward0",    "_ToCopyBackward0",
      "DetachBackward0"};
  for (const std::string_view known : kNames) {
    if (name == known) return true;
  }
  return false;
}

bool is_accumulator(std::string_view name) { return name == "torch::autograd::AccumulateGrad"; }

}  // namespace

void ParameterStorages::add(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return;
  c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
  if (impl == nullptr) return;
  if (++adds_since_prune_ >= kPruneEvery) {
    adds_since_prune_ = 0;
    std::erase_if(storages_, [](const auto& entry) { return entry.second.expired(); });
  }
  auto [it, inserted] = storages_.try_emplace(impl, Weak(tensor.storage().getWeakStorageImpl()));
  if (!inserted && it->second.expired()) it->second = Weak(tensor.storage().getWeakStorageImpl());
}

bool ParameterStorages::contains(const at::Tensor& tensor) const {
  if (!tensor.has_storage()) return false;
  const auto it = storages_.find(tensor.storage().unsafeGetStorageImpl());
  return it != storages_.end() && !it->second.expired();
}

bool derived_from_parameter(const at::Tensor& tensor) {
  if (!tensor.requires_grad()) return false;
  if (tensor.is_leaf()) return true;
  const torch::autograd::Node* node = tensor.grad_fn().get();
  for (int depth = 0; node != nullptr && depth < kMaxChain; ++depth) {
    const std::string name = node->name();
    if (is_accumulator(name)) return true;
    if (!is_view_or_cast(name)) return false;
    const torch::autograd::Node* next = nullptr;
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      if (!edge.is_valid()) continue;
      if (next != nullptr) return false;  // two inputs: a computation
      next = edge.function.get();
    }
    node = next;
  }
  return false;
}

}  // namespace stowage::torch_offload
