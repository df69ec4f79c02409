// SegmentMemory: where whole segments come from, for the segment path (segment_source.hpp).
//
// A CachingAllocator serves blocks out of segments; which memory a segment is made of is this
// interface's business. DeviceSegments takes them from the device (cudaMalloc-like: the usual
// case). Another implementation lets the same block machinery cache a different memory: the
// offload engine's pinned host pool (offload/pinned_segments.hpp) caches page-locked host
// memory, with the same rounding, best fit, splitting, coalescing and stream-ordered reuse.
//
// Contract: try_allocate returns nullptr when the memory is exhausted (no throw for want of
// memory); free takes a pointer try_allocate returned. Called under the allocator's lock, so an
// implementation needs no lock of its own for one allocator. The figures describe the memory as
// the OOM message presents it.
#pragma once

#include <cstddef>
#include <string>

#include "allocator/size_policy.hpp"
#include "device/backend.hpp"

namespace stowage {

// How an out-of-memory message names a memory, in torch's words (Note [OOM message]).
struct MemoryNames {
  std::string kind;    // what ran out: "CUDA", "CPU"
  std::string holder;  // what holds it, opening a sentence: "GPU 0", "The simulated device"
};

// The sizes a segment for a block of `rounded` bytes may have: the preferred one, and the
// smallest that still holds the block (asked for when the preferred one is refused).
struct SegmentSizes {
  std::size_t preferred = 0;
  std::size_t smallest = 0;
};

class SegmentMemory {
 public:
  virtual ~SegmentMemory() = default;

  // A segment of `bytes`, or nullptr when the memory is exhausted.
  virtual void* try_allocate(std::size_t bytes) = 0;
  virtual void free(void* base) = 0;
  // How large a segment for a block of `rounded` bytes should be (Note [Rounding]).
  virtual SegmentSizes sizes_for(std::size_t rounded) const = 0;
  // The memory's capacity, which the allocator's limit (fraction, bytes) is taken of.
  virtual std::size_t total_bytes() const = 0;
  // What is still free of it now; 0 when unknown.
  virtual std::size_t free_bytes() = 0;
  // Names the memory in messages: "device 0", "pinned host memory".
  virtual std::string name() const = 0;
  // Names it as torch's out-of-memory message would.
  virtual MemoryNames names() const = 0;
};

// Segments of device memory, from the backend (try_allocate_segment / free_segment), sized by
// Note [Rounding].
class DeviceSegments final : public SegmentMemory {
 public:
  explicit DeviceSegments(DeviceBackend& backend) : backend_(backend) {}

  void* try_allocate(std::size_t bytes) override { return backend_.try_allocate_segment(bytes); }
  void free(void* base) override { backend_.free_segment(base); }
  SegmentSizes sizes_for(std::size_t rounded) const override {
    return {SizePolicy::segment_size(rounded), SizePolicy::smallest_segment_size(rounded)};
  }
  std::size_t total_bytes() const override { return backend_.properties().total_bytes; }
  std::size_t free_bytes() override { return backend_.memory_info().free_bytes; }
  std::string name() const override {
    return "device " + std::to_string(backend_.properties().device_index);
  }
  // A simulated device's memory is host memory: it serves CPU tensors in CPU mode.
  MemoryNames names() const override {
    const DeviceProperties& properties = backend_.properties();
    if (properties.simulated) return {"CPU", "The simulated device"};
    return {"CUDA", "GPU " + std::to_string(properties.device_index)};
  }

 private:
  DeviceBackend& backend_;
};

}  // namespace stowage
