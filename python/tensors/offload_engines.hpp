// The process's offload engines: one per device whose memory stowage offloads, made on first use.
//
// CPU mode's simulated device gets an engine over CPU mode's backend, with CPU mode's allocator
// relieved by its offloader; a CUDA device gets one over stowage's allocator for that device when
// stowage is torch's CUDA allocator, else over a CUDA backend of its own (offload then works with
// torch's allocator too, without the pressure handler). Buffers come back into storages from
// torch's allocator for the device, on the current stream.
//
// Contract: thread-safe. Engines are never destroyed (torch frees saved tensors during
// interpreter shutdown, after static destructors would have run).
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>

#include "offload/compute_timeline.hpp"
#include "offload/offload_engine.hpp"

namespace stowage::torch_offload {

// `device`'s engine, made now if need be; nullptr when stowage cannot offload its memory (a CPU
// device outside CPU mode, or CUDA in a build without it).
OffloadEngine* engine_for(const c10::Device& device);
// Whether `data` is memory of `device` that its engine offloads: in CPU mode, memory from stowage's
// simulated device (not host memory torch allocated before CPU mode); on CUDA, any.
bool offloadable(const c10::Device& device, const void* data);
// The timeline the device's compute runs on now: CPU mode's calling thread, or the current
// CUDA stream.
std::unique_ptr<ComputeTimeline> current_timeline(const c10::Device& device, OffloadEngine& engine);
// Calls fn for each engine made so far (device index -1: CPU mode).
void for_each_engine(const std::function<void(int device, OffloadEngine&)>& fn);

}  // namespace stowage::torch_offload
