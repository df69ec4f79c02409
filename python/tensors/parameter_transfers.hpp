// ParameterTransfers: the copies of parameters kept on the host (stowage.offload.parameters) to
// and from the device, on the device's offload engine (Note [Parameters off the device] in
// offload/parameter_schedule.hpp): each unit's parameters filled into their device copies on the
// engine's host-to-device stream before the unit runs, the copies' gradients taken to host buffers
// on its device-to-host stream as backward makes them (Note [Gradients in flight] in
// offload/gradient_queue.hpp: sent without a host wait each, landed oldest first, their bytes
// bounded). Counted in the engine's statistics
// ("offload." keys) beside the activations and the optimizer's copies.
//
// A fill leaves each copy's version counter where it was: a copy is the same tensor across its
// fills (the graph that saved it in forward reads it again in backward), and a fill only puts
// back the values it had (or the host parameter's, when the loop wrote them between steps, before
// any graph saved the copy). Ordering follows OptimizerTransfers: copies follow the compute issued
// so far, filled() makes the compute wait for the fills, a gradient's storage is held until its
// copy completed; in CPU mode each copy is done when the call returns.
//
// Contract: one thread at a time (the training thread, or autograd's under the caller's lock);
// the engine outlives it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "offload/gradient_queue.hpp"
#include "python/tensors/optimizer_transfers.hpp"

namespace stowage::torch_offload {

class ParameterTransfers {
 public:
  // At most `gradient_bound_bytes` of gradients in flight (Note [Gradients in flight]).
  ParameterTransfers(const c10::Device& device, std::size_t gradient_bound_bytes)
      : transfers_(device), queue_(gradient_bound_bytes) {}

  // Starts copying each host parameter in `hosts` into its device copy in `copies` (same shape
  // and dtype), versions kept.
  void fill(const std::vector<at::Tensor>& copies, const std::vector<at::Tensor>& hosts);
  // Makes the compute wait for the fills issued so far.
  void filled() { transfers_.written_back(); }
  // Starts copying `gradient` (a device copy's) into the host buffer `destination` (1-D) after
  // the compute that made it, its device memory held until the copy has read it; the gradient
  // joins the queue of those in flight. Returns its ticket.
  std::uint64_t send_gradient(const at::Tensor& destination, const at::Tensor& gradient);
  // Takes the oldest gradients whose copies have landed off the queue, without waiting; returns
  // how many.
  std::size_t landed();
  // Waits for the oldest gradients until those in flight are within the bound; returns how many
  // landed.
  std::size_t land_over_bound();
  // Waits for every gradient in flight; returns how many landed.
  std::size_t land_all();
  std::size_t gradients_in_flight() const noexcept { return queue_.in_flight(); }
  const offload::GradientQueue& gradient_queue() const noexcept { return queue_; }
  // The times the host waited for gradients' copies that had not landed yet (once a landing).
  std::int64_t host_waits() const noexcept { return host_waits_; }
  // Waits for every copy issued so far.
  void synchronize() { transfers_.synchronize(); }

 private:
  // Takes the `count` oldest gradients off the queue, waiting once for their copies to land.
  std::size_t land(std::size_t count);

  OptimizerTransfers transfers_;
  offload::GradientQueue queue_;
  std::deque<std::optional<CopyMark>> in_flight_;  // each queued gradient's copy (nullopt: done when sent)
  std::int64_t host_waits_ = 0;
};

}  // namespace stowage::torch_offload
