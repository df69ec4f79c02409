// HostBucket: one bucket of the offloaded optimizer (Note [Optimizer buckets] in
// offload/adam_buckets.hpp) in host memory: its master weights, moments (and amsgrad's maximum),
// gradient staging buffers and output buffer as flat host tensors from a HostStateStore, each
// parameter's step count, and the bookkeeping of its updates: which runs an update makes, the
// step counts it increments, and the copies of its states that undo a provisional update.
//
// States are fp32 for fp32 parameters. For bf16 and fp16 parameters they are what torch's Adam
// keeps, the parameter and its moments in its own precision ("narrow": the masters are the
// parameters, written back as they are); with master_weights, fp32 masters and moments, rounded
// to the output buffer for the copy back.
//
// An update is a job on an UpdateQueue (offload/update_queue.hpp): it waits for the bucket's
// gradients to be copied out and its last write-back to have left the output buffer, copies the
// states aside when provisional, then runs the AdamW kernel over each run on the RangeWorkers.
// The job holds the bucket's memory (not its tensors), so it never needs the GIL.
//
// Contract: submit(), restore() and forget() from one thread (the optimizer's, under its lock),
// and restore() only once the update it undoes has finished; the tensors handed out stay valid
// as long as anyone holds them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "offload/adamw_kernel.hpp"
#include "offload/update_queue.hpp"
#include "python/tensors/host_state_store.hpp"
#include "python/tensors/optimizer_transfers.hpp"

namespace stowage::torch_offload {

// The kernel's element type of a parameter dtype; LogicError for one the optimizer does not update.
offload::ElementType element_type_of(at::ScalarType dtype);

// torch's own float square root on this CPU (MKL's vmsSqrt in torch's mode, on the calling thread,
// where torch has it; null otherwise).
offload::VectorSqrt torch_vector_sqrt();

struct BucketUpdate {
  offload::AdamWHyperparameters hyper;  // grad_scale included
  int grad_buffer = 0;                  // the staging buffer this step's gradients are in
  bool provisional = false;             // copies the states aside first (restore() undoes it)
  bool cpu_sqrt = true;                 // torch's CPU square root (parameters on a CPU)
};

class HostBucket {
 public:
  // `numels`: the bucket's parameters' element counts, in bucket order; `dtype`: theirs.
  HostBucket(HostStateStore& store, at::ScalarType dtype, const std::vector<std::int64_t>& numels,
             bool master_weights, bool amsgrad, int grad_buffers);

  bool narrow() const noexcept { return narrow_; }
  std::int64_t numel() const noexcept { return numel_; }
  const std::vector<std::int64_t>& offsets() const noexcept { return offsets_; }
  // The flat buffers (out and max_exp_avg_sq: undefined when the bucket has none).
  const at::Tensor& master() const noexcept { return master_; }
  const at::Tensor& exp_avg() const noexcept { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const noexcept { return exp_avg_sq_; }
  const at::Tensor& max_exp_avg_sq() const noexcept { return max_exp_avg_sq_; }
  const at::Tensor& out() const noexcept { return out_; }
  const std::vector<at::Tensor>& grads() const noexcept { return grads_; }
  // Each parameter's step count: a float32 scalar tensor, torch's state["step"].
  const std::vector<at::Tensor>& steps() const noexcept { return steps_; }
  // What an update and its copies move: states, gradients and parameters.
  std::int64_t bytes() const noexcept { return bytes_; }

  // Increments the step count of each parameter with a gradient and submits their update; the
  // ticket completes with it. Nothing is submitted (nullptr) when none has a gradient.
  std::shared_ptr<offload::UpdateTicket> submit(offload::UpdateQueue& queue, const BucketUpdate& update,
                                                const std::vector<bool>& has_gradient,
                                                std::optional<CopyMark> copied, std::optional<CopyMark> returned);
  // Undoes the provisional update submitted since the last forget(): states and step counts as
  // they were. Returns whether there was one.
  bool restore();
  // The provisional update stands (its backward ended, or step() took it).
  void forget() noexcept { saved_steps_.reset(); }

 private:
  struct Memory;  // the bucket's host blocks and undo copies, shared with its update jobs

  bool narrow_ = false;
  std::int64_t numel_ = 0;
  std::int64_t bytes_ = 0;
  std::vector<std::int64_t> offsets_;
  std::vector<std::int64_t> numels_;
  at::Tensor master_, exp_avg_, exp_avg_sq_, max_exp_avg_sq_, out_;
  std::vector<at::Tensor> grads_;
  std::vector<at::Tensor> steps_;
  std::shared_ptr<Memory> memory_;
  std::optional<std::vector<float>> saved_steps_;  // before the provisional update
};

}  // namespace stowage::torch_offload
