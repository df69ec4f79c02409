// Which saved tensors hold a parameter's memory (Note [Parameters are not offloaded]).
//
// Note [Parameters are not offloaded]
// Offloading a tensor frees device memory only when nothing else holds its storage. A parameter's
// storage is held by its module for the whole run, so offloading a saved parameter frees nothing
// and moves every weight out and back every step. The test is by storage, not by type:
// nn.Linear saves weight.t(), a view that is no Parameter; autocast keeps the low-precision
// cast of each parameter in its cache until the autocast region ends, so those casts are held
// too. A saved tensor is a parameter's when
//   - its storage is one of the storages registered here (the parameters and buffers of the
//     modules that ran inside the offload region), or
//   - it is a leaf that requires grad (a parameter nobody registered), or
//   - its autograd history is a chain of views and dtype casts ending at a leaf's gradient
//     accumulator: weight.t(), autocast's cached cast weight.to(bf16), a view of either.
// Inputs and activations never match: their histories contain real computation, or they are
// leaves that do not require grad and belong to no module.
//
// Contract: ParameterStorages is not thread-safe (one offload region on one thread uses it). It
// holds weak references, so registering a storage never keeps its memory alive.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <unordered_map>

namespace stowage::torch_offload {

class ParameterStorages {
 public:
  // Registers the storage of `tensor` (a parameter or a buffer).
  void add(const at::Tensor& tensor);
  bool contains(const at::Tensor& tensor) const;

 private:
  using Weak = c10::weak_intrusive_ptr<c10::StorageImpl>;
  std::unordered_map<const c10::StorageImpl*, Weak> storages_;
  std::size_t adds_since_prune_ = 0;
};

// Whether `tensor` is a leaf that requires grad, or a view or cast of one (by its history).
bool derived_from_parameter(const at::Tensor& tensor);

}  // namespace stowage::torch_offload
