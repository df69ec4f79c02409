#include "python/bindings/torch/snapshot_dict.hpp"

#include <map>

namespace py = pybind11;

namespace stowage::python {

namespace {

const char* state_name(BlockState state) {
  switch (state) {
    case BlockState::kAllocated: return "active_allocated";
    case BlockState::kPendingFree: return "active_pending_free";
    case BlockState::kFree: return "inactive";
  }
  return "inactive";
}

// Frames are shared between the events with the same stack, as in torch's snapshots.
class FrameLists {
 public:
  explicit FrameLists(const torch_cpu::StackTable& stacks) : stacks_(stacks) {}
  py::list operator()(std::uint64_t handle) {
    if (handle == 0) return py::list();
    const auto found = cache_.find(handle);
    if (found != cache_.end()) return found->second;
    py::list frames;
    for (const torch_cpu::Frame& frame : stacks_.frames(handle)) {
      py::dict entry;
      entry["filename"] = frame.filename;
      entry["line"] = frame.line;
      entry["name"] = frame.name;
      frames.append(entry);
    }
    cache_.emplace(handle, frames);
    return frames;
  }

 private:
  const torch_cpu::StackTable& stacks_;
  std::map<std::uint64_t, py::list> cache_;
};

}  // namespace

py::dict snapshot_dict(const AllocatorSnapshot& snapshot, const torch_cpu::StackTable& stacks,
                       const std::string& settings) {
  FrameLists frames(stacks);
  py::list segments;
  for (const SegmentSnapshot& segment : snapshot.segments) {
    py::dict out;
    out["device"] = snapshot.device;
    out["address"] = segment.address;
    out["total_size"] = segment.total_size;
    out["allocated_size"] = segment.allocated_size;
    out["active_size"] = segment.active_size;
    out["requested_size"] = segment.requested_size;
    out["stream"] = segment.stream.handle;
    out["segment_type"] = segment.size_class == SizeClass::kSmall ? "small" : "large";
    out["segment_pool_id"] = py::make_tuple(0, 0);
    out["is_expandable"] = segment.is_expandable;
    out["frames"] = frames(segment.context);
    py::list blocks;
    for (const BlockSnapshot& block : segment.blocks) {
      py::dict entry;
      entry["address"] = block.address;
      entry["size"] = block.size;
      entry["requested_size"] = block.requested_size;
      entry["state"] = state_name(block.state);
      entry["frames"] = frames(block.context);
      blocks.append(entry);
    }
    out["blocks"] = blocks;
    segments.append(out);
  }
  py::list trace;
  for (const TraceEntry& event : snapshot.trace) {
    py::dict entry;
    entry["action"] = std::string(trace_action_name(event.action));
    // torch's snapshots give an oom event the device's free bytes under "device_free".
    entry[event.action == TraceAction::kOom ? "device_free" : "addr"] = event.address;
    entry["size"] = event.size;
    entry["stream"] = event.stream.handle;
    entry["time_us"] = event.time_us;
    entry["frames"] = frames(event.context);
    if (const std::string_view marker = marker_metadata(event.action); !marker.empty()) {
      entry["user_metadata"] = std::string(marker);
    }
    trace.append(entry);
  }
  py::list device_traces;
  device_traces.append(trace);
  py::dict allocator_settings;
  allocator_settings["allocator"] = "stowage";
  allocator_settings["config"] = settings;
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = device_traces;
  out["allocator_settings"] = allocator_settings;
  return out;
}

}  // namespace stowage::python
