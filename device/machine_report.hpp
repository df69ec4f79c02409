// `stowage doctor`'s report as the tables it prints: the facts the probes beside this file, hwloc
// and the Python layer (torch, stowage's torch module, the environment) found, each section one
// table of text cells. The printer only lays them out.
//
// Contract: a pure function; the tables come in a fixed order (stowage, CUDA, GPUs, torch, host
// memory, NUMA, and NUMA nodes unless hwloc failed); an unknown text fact quoted in a cell reads
// "None", as the report's JSON null reads when formatted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda_driver_probe.hpp"
#include "device/host_memory_probe.hpp"
#include "device/numa_topology.hpp"

namespace stowage {

struct StowageTorchModule {  // stowage._torch, as the Python layer found it
  bool importable = false;
  std::optional<std::string> error, built_for_torch;
  bool matches_torch = false, cuda_allocator_built = false;
  std::vector<std::string> cuda_torch_versions;
  bool cuda_allocator_enabled = false, cpu_allocator_enabled = false;
};

struct TorchReport {
  bool installed = false;
  std::optional<std::string> error, version, cuda_build;
  std::optional<std::int64_t> cuda_device_count;  // none: a CPU-only build of torch
  StowageTorchModule module;                       // meaningless unless installed
  std::vector<std::pair<std::string, std::string>> environment;  // name, value as Python's repr() quotes it
};

struct ReportedGpu {
  GpuFacts facts;
  std::optional<std::vector<std::int64_t>> numa_nodes;  // none: hwloc does not list the device
};

struct MachineReport {
  CudaDriverFacts driver;  // its gpus are not read: `gpus` are the report's (the driver's or nvidia-smi's)
  CudaRuntimeFacts runtime;
  std::vector<ReportedGpu> gpus;
  TorchReport torch;
  HostMemoryFacts memory;
  std::optional<std::string> numa_error;  // set: hwloc failed and `numa` is empty
  NumaTopology numa;
};

struct FactsTable {
  std::string title;
  std::vector<std::string> columns;  // empty: a table of (fact, value) rows without a header
  std::vector<std::vector<std::string>> rows;
};

std::vector<FactsTable> machine_report_tables(const MachineReport& report);

}  // namespace stowage
