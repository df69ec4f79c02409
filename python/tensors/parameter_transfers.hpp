// ParameterTransfers: the copies of parameters kept on the host (stowage.offload.parameters) to
// and from the device, on the device's offload engine (Note [Parameters off the device] in
// offload/parameter_schedule.hpp): each unit's parameters filled into their device copies on the
// engine's host-to-device stream before the unit runs, the copies' gradients taken to host buffers
// on its device-to-host stream as backward makes them. Counted in the engine's statistics
// ("offload." keys) beside the activations and the optimizer's copies.
//
// A fill leaves each copy's version counter where it was: a copy is the same tensor across its
// fills (the graph that saved it in forward reads it again in backward), and a fill only puts
// back the values it had (or the host parameter's, when the loop wrote them between steps, before
// any graph saved the copy). Ordering follows OptimizerTransfers: copies follow the compute issued
// so far, filled() makes the compute wait for the fills, a gradient's storage is held until its
// copy completed; in CPU mode each copy is done when the call returns.
//
// Contract: one thread at a time (the training thread); the engine outlives it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

#include "python/tensors/optimizer_transfers.hpp"

namespace stowage::torch_offload {

class ParameterTransfers {
 public:
  explicit ParameterTransfers(const c10::Device& device) : transfers_(device) {}

  // Starts copying each host parameter in `hosts` into its device copy in `copies` (same shape
  // and dtype), versions kept.
  void fill(const std::vector<at::Tensor>& copies, const std::vector<at::Tensor>& hosts);
  // Makes the compute wait for the fills issued so far.
  void filled() { transfers_.written_back(); }
  // Starts copying `gradient` (a device copy's) into the host buffer `destination` (1-D).
  void copy_out(const at::Tensor& destination, const at::Tensor& gradient) {
    transfers_.copy_out(destination, gradient);
  }
  // Waits for every copy issued so far.
  void synchronize() { transfers_.synchronize(); }

 private:
  OptimizerTransfers transfers_;
};

}  // namespace stowage::torch_offload
