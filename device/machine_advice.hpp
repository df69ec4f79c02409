// `stowage doctor`'s verdicts: one line per thing on this machine that limits stowage, stated as
// fact plus remedy, drawn from the machine's facts (the probes beside this file, hwloc's topology,
// and what the Python layer found of torch and stowage's torch module).
//
// A text fact that may be unknown is optional; where a line quotes an unknown one it reads
// "None", as the report's JSON null reads when formatted. Contract: a pure function; the lines
// come in a fixed order (CUDA, torch, locked memory, NUMA).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stowage {

struct AdvisedGpu {
  std::int64_t index = 0;
  std::optional<std::string> name;
  bool from_nvidia_smi = false;  // listed by nvidia-smi, not by the driver's API
  std::optional<bool> virtual_memory_management;
  std::optional<std::string> pci_bus_id;
  std::optional<std::vector<std::int64_t>> numa_nodes;  // none: hwloc does not list the device
  std::optional<std::string> near_cpus;
};

struct TorchFacts {
  bool installed = false;
  std::optional<std::string> version, cuda_build;
  bool module_importable = false;  // stowage._torch
  std::optional<std::string> module_error, built_for_torch;
  bool matches_torch = false, cuda_allocator_built = false;
  std::optional<std::string> import_error;  // why `import torch` failed, where it did
};

struct MachineFacts {
  bool stowage_with_cuda = false;
  std::optional<std::string> driver_error, driver_version, runtime_version, runtime_library;
  std::string cuda_visible_devices = "unset";  // as the advice quotes it
  std::vector<AdvisedGpu> gpus;
  TorchFacts torch;
  std::optional<std::uint64_t> memlock_soft, memlock_hard;  // none: unlimited
  std::uint64_t total_memory = 0;
  std::optional<std::string> numa_error, process_cpus;
  std::vector<std::int64_t> process_numa_nodes;
};

std::vector<std::string> machine_advice(const MachineFacts& facts);

}  // namespace stowage
