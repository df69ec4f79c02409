// OptimizerTransfers: the offloaded optimizer's copies between one device's tensors and its host
// buffers, on the device's offload engine (offload/transfer_engine.hpp): the engine's
// device-to-host stream takes gradients out, its host-to-device stream brings parameters back,
// and both are counted in the engine's statistics (stowage.memory_stats()'s "offload." keys)
// beside the activations' buffers.
//
// Each copy follows the compute issued so far (current_timeline: the current CUDA stream, or CPU
// mode's calling thread): a gradient is final there, a parameter no longer read there. On a GPU
// the copies run behind compute, a gradient's storage is held until its copy has completed, and
// written_back() makes the compute stream wait for the write-backs. In CPU mode a copy of device
// memory crosses the simulated device's link (copy_bandwidth, injected faults) and is done when
// the call returns; a copy that touches no device memory (a plain CPU device, or tensors made
// before CPU mode) is torch's copy_.
//
// Contract: one thread at a time (its AdamSlots' thread: Note [Overlapped steps]); the engine
// outlives it.
// Parameters written back have their version bumped, as copy_ would.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "offload/offload_engine.hpp"

namespace stowage::torch_offload {

// The completion of a copy and of every copy issued before it on the same stream.
struct CopyMark {
  OffloadEngine* engine = nullptr;
  TransferHandle transfer;
  std::size_t bytes = 0;  // what waiting for it waits for
  bool done() const { return engine->transfers().done(transfer); }
};

// Makes `device`'s current compute (the current CUDA stream; CPU mode's calling thread) wait for
// the copy `mark` and every copy before it on its stream. Thread-safe (the engine's lock).
void compute_waits_for(const c10::Device& device, const CopyMark& mark);

class OptimizerTransfers {
 public:
  explicit OptimizerTransfers(const c10::Device& device);
  ~OptimizerTransfers();
  OptimizerTransfers(const OptimizerTransfers&) = delete;
  OptimizerTransfers& operator=(const OptimizerTransfers&) = delete;

  // Starts copying `gradient` into the host buffer `destination` (1-D, same numel).
  void copy_out(const at::Tensor& destination, const at::Tensor& gradient);
  // The copies out issued so far (nullopt: all are done already).
  std::optional<CopyMark> copies_out_issued();
  // Starts writing `sources` (host) into `params`; the mark completes when the host buffers may
  // be written again (nullopt: at once).
  std::optional<CopyMark> write_back(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& sources);
  // Makes the compute wait for the write-backs issued so far.
  void written_back();
  // Waits for every copy issued so far (Note [Bounded waits]: each wait's deadline follows the
  // bytes in flight).
  void synchronize();
  // Lets go of the gradients whose copies have completed (their device memory may be reused).
  void release_done();

 private:
  // Copies `bytes` over the engine after the compute so far; waits at once in CPU mode.
  TransferHandle copy(TransferDirection direction, void* dst, const void* src, std::size_t bytes);
  // Whether `tensor`'s memory is the device's, so that its copy crosses the engine.
  bool crosses_link(const at::Tensor& tensor) const;

  c10::Device device_;
  OffloadEngine* engine_;  // null: a plain CPU device
  std::optional<CopyMark> last_out_;
  std::optional<CopyMark> last_back_;
  std::vector<std::pair<TransferHandle, c10::Storage>> held_;  // gradients in flight (GPU)
};

}  // namespace stowage::torch_offload
