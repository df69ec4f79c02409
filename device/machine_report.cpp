#include "device/machine_report.hpp"

#include "base/build_info.hpp"
#include "base/byte_units.hpp"

namespace stowage {

namespace {

using Rows = std::vector<std::vector<std::string>>;

std::string text(const std::optional<std::string>& value) { return value.value_or("None"); }

std::string text_or(const std::optional<std::string>& value, const std::string& otherwise) {
  return value && !value->empty() ? *value : otherwise;
}

std::string bytes(std::optional<std::uint64_t> value) {
  return value ? format_bytes(*value) : "unlimited";
}

std::string yes(std::optional<bool> value) { return !value ? "unknown" : *value ? "yes" : "no"; }

template <typename Number>
std::string joined(const std::vector<Number>& numbers) {
  std::string out;
  for (const Number number : numbers) {
    if (!out.empty()) out += ',';
    out += std::to_string(number);
  }
  return out;
}

FactsTable stowage_table(const StowageTorchModule& module) {
  std::string versions;
  for (const std::string& version : module.cuda_torch_versions) {
    if (!versions.empty()) versions += ", ";
    versions += version;
  }
  std::string allocator = "not built";
  if (module.cuda_allocator_built) allocator = versions.empty() ? "built" : "built for torch " + versions;
  const std::string sanitizer(build_info::kSanitizer);
  return {"stowage", {}, Rows{
      {"version", std::string(build_info::kVersion)},
      {"build type", std::string(build_info::kBuildType) + (sanitizer.empty() ? "" : ", sanitizer " + sanitizer)},
      {"compiler", std::string(build_info::kCompiler)},
      {"CUDA backend", build_info::kWithCuda ? "built (CUDA " + std::string(build_info::kCudaVersion) + ")"
                                             : "not built"},
      {"torch integration", build_info::kWithTorch ? "built for torch " + std::string(build_info::kTorchVersion)
                                                   : "not built"},
      {"torch CUDA allocator", allocator}}};
}

FactsTable cuda_table(const CudaDriverFacts& driver, const CudaRuntimeFacts& runtime) {
  std::string driver_devices = std::to_string(driver.device_count);
  if (driver.version && driver.error) driver_devices += " (" + *driver.error + ")";
  return {"CUDA", {}, Rows{
      {"driver", driver.version ? "CUDA " + *driver.version + " (" + text(driver.library) + ")"
                                : text_or(driver.error, "unknown")},
      {"driver devices", driver_devices},
      {"runtime", runtime.version ? "CUDA " + *runtime.version + " (" + text(runtime.library) + ")"
                                  : text_or(runtime.error, "unknown")},
      {"runtime devices", runtime.device_count ? std::to_string(*runtime.device_count)
                                               : "none (" + text(runtime.error) + ")"}}};
}

FactsTable gpus_table(const std::vector<ReportedGpu>& gpus, const CudaDriverFacts& driver) {
  if (gpus.empty()) return {"GPUs", {}, Rows{{"none", text_or(driver.error, "the driver reports no GPU")}}};
  FactsTable table{"GPUs", {"#", "name", "memory", "PCI bus id", "compute capability", "VMM", "NUMA node"}, {}};
  for (const ReportedGpu& gpu : gpus) {
    const GpuFacts& facts = gpu.facts;
    table.rows.push_back({std::to_string(facts.index), text_or(facts.name, "?"),
                          facts.total_memory ? format_bytes(*facts.total_memory) : "?",
                          text_or(facts.pci_bus_id, "?"), text_or(facts.compute_capability, "?"),
                          yes(facts.virtual_memory_management),
                          gpu.numa_nodes ? joined(*gpu.numa_nodes) : "unknown"});
  }
  return table;
}

FactsTable torch_table(const TorchReport& torch) {
  if (!torch.installed) return {"torch", {}, Rows{{"installed", "no (" + text(torch.error) + ")"}}};
  const StowageTorchModule& module = torch.module;
  const std::string built = module.importable ? "built for torch " + text(module.built_for_torch) +
                                                   (module.matches_torch ? "" : " (not this torch)")
                                             : "cannot be imported: " + text(module.error);
  FactsTable table{"torch", {}, Rows{
      {"version", text(torch.version)},
      {"CUDA build", text_or(torch.cuda_build, "none (CPU-only build)")},
      {"GPUs torch sees", torch.cuda_device_count ? std::to_string(*torch.cuda_device_count) : "-"},
      {"stowage._torch", built},
      {"stowage is the CUDA allocator", yes(module.cuda_allocator_enabled)},
      {"stowage is the CPU allocator", yes(module.cpu_allocator_enabled)}}};
  for (const auto& [name, value] : torch.environment) table.rows.push_back({name, value});
  return table;
}

FactsTable memory_table(const HostMemoryFacts& memory) {
  return {"host memory", {}, Rows{
      {"physical", format_bytes(memory.physical_bytes)},
      {"available", memory.available_bytes ? format_bytes(*memory.available_bytes) : "unknown"},
      {"cgroup's room", memory.cgroup_room_bytes ? format_bytes(*memory.cgroup_room_bytes) : "no limit"},
      {"locked-memory limit (ulimit -l)",
       bytes(memory.memlock_soft) + " (hard: " + bytes(memory.memlock_hard) + ")"}}};
}

void add_numa_tables(const MachineReport& report, std::vector<FactsTable>& tables) {
  if (report.numa_error) {
    tables.push_back({"NUMA", {}, Rows{{"hwloc", *report.numa_error}}});
    return;
  }
  const NumaTopology& numa = report.numa;
  tables.push_back({"NUMA", {}, Rows{
      {"hwloc", numa.hwloc_api_version},
      {"machine", std::to_string(numa.packages) + " package(s), " + std::to_string(numa.cores) + " cores, " +
                      std::to_string(numa.processing_units) + " hardware threads, " +
                      std::to_string(numa.nodes.size()) + " NUMA node(s)"},
      {"this process", "CPUs " + numa.process_cpus + ", NUMA node " + joined(numa.process_numa_nodes)}}});
  FactsTable nodes{"NUMA nodes", {"node", "memory", "CPUs", "allowed"}, {}};
  for (const NumaNode& node : numa.nodes) {
    nodes.rows.push_back(
        {std::to_string(node.os_index), format_bytes(node.local_memory), node.cpus, yes(node.allowed)});
  }
  tables.push_back(std::move(nodes));
}

}  // namespace

std::vector<FactsTable> machine_report_tables(const MachineReport& report) {
  std::vector<FactsTable> tables{stowage_table(report.torch.installed ? report.torch.module : StowageTorchModule{}),
                                 cuda_table(report.driver, report.runtime), gpus_table(report.gpus, report.driver),
                                 torch_table(report.torch), memory_table(report.memory)};
  add_numa_tables(report, tables);
  return tables;
}

}  // namespace stowage
