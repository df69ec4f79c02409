// HostBucket: one bucket of the offloaded optimizer (Note [Optimizer buckets] in
// offload/adam_buckets.hpp) in host memory: the states torch's optimizer keeps (moments, amsgrad's
// maximum, each parameter's step count) and, with master_weights, the fp32 masters, as flat host
// tensors from a HostStateStore; and the bookkeeping of its updates: which runs an update makes,
// the step counts it increments, and, for provisional updates, the second set of its states they
// are written to (Note [Provisional updates out of place]).
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
// buffers wait for (the gradients copied out, the last write-back gone from them), then runs the
// AdamW kernel over each run on the RangeWorkers. The job holds the bucket's memory and its
// buffers' (not their tensors), so it never needs the GIL.
//
// Note [Provisional updates out of place]
// update="in_backward" updates a bucket in backward, before step() says whether the update stands
// (a backward that raises, zero_grad() without step(), a refusal or options changed since undo
// it: Note [Offloaded optimizer semantics] in offload/slot_book.hpp). Such a provisional update
// reads the states as they are (the parameters' copy, the moments, amsgrad's maximum) and writes
// its results out of place, into a second set of buffers of the same sizes (DoubleBuffer); its
// step counts wait beside them. stand() (step() writing the bucket back) makes the results
// current by swapping the memory behind the two sets' storages and sets the step counts; restore()
// drops them: nothing is copied either way. The update reads each state once and writes it once
// (the kernel's Note [Out-of-place updates] in offload/adamw_kernel.cpp: about 1.5x the memory
// traffic of an in-place update's states, where copying them aside first, on the job's one
// thread, was 2x and unthreaded). The elements of parameters without a gradient this step, which the kernel does
// not write, are copied into the second set (copied_bytes(); none when every parameter has one).
// The swap is of storages, not tensors, so the tensors handed out (the slots' views, torch's
// optimizer.state entries, a state_dict's tensors, FSDP2's DTensors over them) stay the same
// objects and show the current set: until step() the states before the update, as torch's
// optimizer shows them, then its results. The second set comes from the same store as the first
// (pinned for a device: the two sets trade places, and the parameters' copy is written back from
// whichever is current) and is counted in the host bytes a parameter (bytes_per_parameter's
// state_sets): 12 bytes more a fp32 parameter (16 with amsgrad), where the copies aside the
// update used to take were 12-16 bytes of pageable memory no estimate counted.
//
// Contract: submit(), stand() and restore() from one thread at a time (the optimizer's, under its
// lock, or an overlapped step's), and stand() and restore() only once the update has finished
// (stand() swaps memory the update writes); the tensors handed out stay valid as long as anyone
// holds them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "offload/adamw_kernel.hpp"
#include "offload/update_queue.hpp"
#include "python/tensors/double_buffer.hpp"
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
  bool provisional = false;             // out of place, until stand() (Note [Provisional updates out of place])
  bool cpu_sqrt = true;                 // torch's CPU square root (parameters on a CPU)
};

// What one update reads and writes beside the bucket's states, each a bucket's worth of elements:
// `parameters` in the states' type (fp32 masters, or a narrow bucket's parameters), updated in
// place; `gradients` in the parameters' dtype; `output` (null unless the masters are fp32 and the
// parameters are not) the parameters rounded for the copy back. `held`: the memory behind them,
// kept by the update job; `waits`: the copies the update waits for before it reads them.
// `parameters_spare`: a provisional update's parameters, written out of place into its spare and
// swapped by the bucket's stand() (null where they are the bucket's own masters, which keep their
// own spare); its owner outlives the bucket's updates (BucketBuffers).
struct UpdateBuffers {
  void* parameters = nullptr;
  const void* gradients = nullptr;
  void* output = nullptr;
  DoubleBuffer* parameters_spare = nullptr;
  std::vector<std::shared_ptr<void>> held;
  std::vector<CopyMark> waits;
};

class HostBucket {
 public:
  // `numels`: the bucket's parameters' element counts, in bucket order; `dtype`: theirs.
  // `provisional`: its updates may be provisional, so it keeps a second set of its states.
  HostBucket(HostStateStore& store, at::ScalarType dtype, const std::vector<std::int64_t>& numels,
             bool master_weights, bool amsgrad, bool provisional);

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
  // Bytes of host memory its states take, both sets where it keeps two.
  std::int64_t state_bytes() const noexcept { return state_bytes_; }
  // Bytes its provisional updates copied between the two sets (the elements of parameters that
  // had no gradient), since it was made.
  std::int64_t copied_bytes() const noexcept { return copied_bytes_; }

  // Increments the step count of each parameter with a gradient and submits their update over
  // `buffers`; the ticket completes with it. Nothing is submitted (nullptr) when none has a gradient.
  // Provisional: the results and step counts wait in the second set until stand() (LogicError
  // while an earlier provisional update neither stood nor was undone).
  std::shared_ptr<offload::UpdateTicket> submit(offload::UpdateQueue& queue, const BucketUpdate& update,
                                                const std::vector<bool>& has_gradient, UpdateBuffers buffers);
  // The provisional update stands (step() took it): its results and step counts become current.
  // Returns whether there was one; again, nothing.
  bool stand();
  // Undoes the provisional update: its results are dropped, the states and step counts stay as
  // they were. Returns whether there was one.
  bool restore();

 private:
  struct Memory;  // the bucket's host blocks, shared with its update jobs
  // A provisional update's results, waiting to stand.
  struct Provisional {
    std::vector<float> steps;
    std::vector<DoubleBuffer*> swapped;  // the buffers stand() swaps
  };

  // The update's states: read from the current set, written to it (in place) or to the second set.
  struct SetPointers;
  SetPointers set_pointers(const UpdateBuffers& buffers, bool provisional) const;

  bool narrow_ = false;
  at::ScalarType dtype_;
  at::ScalarType state_type_;
  std::int64_t numel_ = 0;
  std::int64_t bytes_ = 0;
  std::int64_t state_bytes_ = 0;
  std::int64_t copied_bytes_ = 0;
  std::vector<std::int64_t> offsets_;
  std::vector<std::int64_t> numels_;
  at::Tensor master_, exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
  std::vector<at::Tensor> steps_;
  // The second set (provisional updates; empty otherwise), in the order master (where the bucket
  // has its own), exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad).
  std::vector<std::unique_ptr<DoubleBuffer>> spares_;
  DoubleBuffer* master_spare_ = nullptr;
  std::shared_ptr<Memory> memory_;
  std::optional<Provisional> provisional_;
};

}  // namespace stowage::torch_offload
