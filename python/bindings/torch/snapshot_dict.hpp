// An AllocatorSnapshot as the dict torch.cuda.memory._snapshot() returns: segments (with
// blocks, states and frames), device_traces, allocator_settings. So torch.cuda._memory_viz and
// pytorch.org/memory_viz read stowage's snapshots as they read PyTorch's.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "allocator/snapshot.hpp"
#include "python/tensors/stack_table.hpp"

namespace stowage::python {

pybind11::dict snapshot_dict(const AllocatorSnapshot& snapshot,
                             const torch_cpu::StackTable& stacks, const std::string& settings);

}  // namespace stowage::python
