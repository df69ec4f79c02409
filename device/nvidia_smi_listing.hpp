// The GPUs in nvidia-smi's listing: `stowage doctor` asks nvidia-smi when the driver's API lists
// none, and this reads what it printed for
//   nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id,compute_cap --format=csv,noheader,nounits
// Contract: a pure function over the text (the caller runs the program). A row that does not have
// those five fields is skipped; a field that does not read as its kind is unknown (an index that is
// not a number is the GPU's position among the rows kept; memory not a number of MiB, or too large
// for a byte count, is none; a compute capability not "<digits>.<digits>" is none). Fields are
// CSV: separated by commas, spaces after a comma skipped, a field in double quotes may hold commas
// and doubled quotes. virtual_memory_management is none: nvidia-smi does not say.
#pragma once

#include <string_view>
#include <vector>

#include "device/cuda_driver_probe.hpp"

namespace stowage {

std::vector<GpuFacts> nvidia_smi_gpus(std::string_view listing);

}  // namespace stowage
