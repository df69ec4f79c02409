// HostBucket: one bucket of the offloaded optimizer (Note [Optimizer buckets] in
// offload/adam_buckets.hpp) in host memory: the states torch's optimizer keeps (moments, amsgrad's
// maximum, each parameter's step count) and, with master_weights, the fp32 masters, as flat host
// tensors from a HostStateStore; and the bookkeeping of its updates: which runs an update makes,
// the step counts it increments, and the copies of its states that undo a provisional update.
// The parameters and gradients an update reads are not the bucket's: the caller hands in
// UpdateBuffers, kept per bucket (bucket_buffers.hpp, the modes that copy gradients out in
// backward) or staged through a ring (staging_ring.hpp, update="exact").
//
// States are fp32 for fp32 parameters. For bf16 and fp16 parameters they are what torch's Adam
// keeps, the moments in the parameter's own precision (the parameters "narrow", updated as they
// are); with master_weights, fp32 masters and moments, rounded to the output buffer for the copy
// back.
//
// An update is a job on an UpdateQueue (offload/update_queue.hpp): it waits for the copies its
// buffers wait for (the gradients copied out, the last write-back gone from them), copies the
// states aside when provisional, then runs the AdamW kernel over each run on the RangeWorkers.
// The job holds the bucket's memory and its buffers' (not their tensors), so it never needs the GIL.
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
  bool provisional = false;             // copies the states aside first (restore() undoes it)
  bool cpu_sqrt = true;                 // torch's CPU square root (parameters on a CPU)
};

// What one update reads and writes beside the bucket's states, each a bucket's worth of elements:
// `parameters` in the states' type (fp32 masters, or a narrow bucket's parameters), updated in
// place; `gradients` in the parameters' dtype; `output` (null unless the masters are fp32 and the
// parameters are not) the parameters rounded for the copy back. `held`: the memory behind them,
// kept by the update job; `waits`: the copies the update waits for before it reads them.
struct UpdateBuffers {
  void* parameters = nullptr;
  const void* gradients = nullptr;
  void* output = nullptr;
  std::vector<std::shared_ptr<void>> held;
  std::vector<CopyMark> waits;
};

class HostBucket {
 public:
  // `numels`: the bucket's parameters' element counts, in bucket order; `dtype`: theirs.
  HostBucket(HostStateStore& store, at::ScalarType dtype, const std::vector<std::int64_t>& numels,
             bool master_weights, bool amsgrad);

  bool narrow() const noexcept { return narrow_; }
  at::ScalarType dtype() const noexcept { return dtype_; }
  // The states' element type: fp32, or the parameters' own when narrow.
  at::ScalarType state_type() const noexcept { return state_type_; }
  std::int64_t numel() const noexcept { return numel_; }
  const std::vector<std::int64_t>& offsets() const noexcept { return offsets_; }
  // The flat states (master: the fp32 masters of parameters that are not fp32, with master_weights;
  // max_exp_avg_sq: amsgrad's; undefined when the bucket has none).
  const at::Tensor& master() const noexcept { return master_; }
  const at::Tensor& exp_avg() const noexcept { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const noexcept { return exp_avg_sq_; }
  const at::Tensor& max_exp_avg_sq() const noexcept { return max_exp_avg_sq_; }
  // Each parameter's step count: a float32 scalar tensor, torch's state["step"].
  const std::vector<at::Tensor>& steps() const noexcept { return steps_; }
  // What an update and its copies move: states, gradients and parameters.
  std::int64_t bytes() const noexcept { return bytes_; }

  // Increments the step count of each parameter with a gradient and submits their update over
  // `buffers`; the ticket completes with it. Nothing is submitted (nullptr) when none has a gradient.
  std::shared_ptr<offload::UpdateTicket> submit(offload::UpdateQueue& queue, const BucketUpdate& update,
                                                const std::vector<bool>& has_gradient, UpdateBuffers buffers);
  // Undoes the provisional update submitted since the last forget(): states (its buffers'
  // parameters included) and step counts as they were. Returns whether there was one.
  bool restore();
  // The provisional update stands (its backward ended, or step() took it).
  void forget() noexcept { saved_steps_.reset(); }

 private:
  struct Memory;  // the bucket's host blocks and undo copies, shared with its update jobs

  bool narrow_ = false;
  at::ScalarType dtype_;
  at::ScalarType state_type_;
  std::int64_t numel_ = 0;
  std::int64_t bytes_ = 0;
  std::vector<std::int64_t> offsets_;
  std::vector<std::int64_t> numels_;
  at::Tensor master_, exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
  std::vector<at::Tensor> steps_;
  std::shared_ptr<Memory> memory_;
  std::optional<std::vector<float>> saved_steps_;  // before the provisional update
};

}  // namespace stowage::torch_offload
