// BucketBuffers: the buffers one bucket keeps in host memory from step to step where gradients are
// copied out during backward (update="in_backward" and "delayed", Note [Optimizer buckets] in
// offload/adam_buckets.hpp): its parameters' copy (the fp32 masters of fp32 parameters, or a
// narrow bucket's parameters; the HostBucket's own masters where it has them), its gradient
// buffers (two with delayed updates: the next step's arrive while the last step's update reads the
// other) and, with fp32 masters of parameters that are not fp32, the output buffer the update
// rounds them to for the copy back. update="exact" stages these through a ring instead
// (staging_ring.hpp). Where the host bucket's updates are provisional (update="in_backward") the
// parameters' copy has a second buffer its updates write to (Note [Provisional updates out of
// place] in host_bucket.hpp), swapped by the host bucket's stand().
//
// Contract: not thread-safe (one thread at a time: the optimizer's, under its lock, or an
// overlapped step's); the memory lives as long as this and every update holding it (for_update()).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "python/tensors/host_bucket.hpp"
#include "python/tensors/host_state_store.hpp"

namespace stowage::torch_offload {

class BucketBuffers {
 public:
  // `provisional`: the host bucket's updates may be provisional (it keeps a second set of states).
  BucketBuffers(HostStateStore& store, const HostBucket& host, int grad_buffers, bool provisional);

  // The flat parameters the update reads and updates (the states' type).
  const at::Tensor& parameters() const noexcept { return parameters_; }
  const std::vector<at::Tensor>& gradients() const noexcept { return gradients_; }
  // Undefined unless the masters are fp32 and the parameters are not.
  const at::Tensor& output() const noexcept { return output_; }
  // What is written back: the output where there is one, else the parameters.
  const at::Tensor& written_back() const noexcept { return output_.defined() ? output_ : parameters_; }
  // The update's buffers with this step's gradients in `grad_buffer`, after `waits`.
  UpdateBuffers for_update(int grad_buffer, std::vector<CopyMark> waits);


 private:
  std::vector<std::shared_ptr<void>> blocks_;
  at::Tensor parameters_;
  std::vector<at::Tensor> gradients_;
  at::Tensor output_;
  std::unique_ptr<DoubleBuffer> parameters_spare_;  // provisional updates of parameters not the host's masters
};

}  // namespace stowage::torch_offload
