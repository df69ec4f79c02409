// Facts about the machine, as plain dicts and lists (JSON-ready, for `stowage doctor`):
// stowage._core.numa_topology, build_info, cuda_driver, nvidia_smi_gpus, cuda_runtime and host_memory;
// the doctor's advice and tables over them (machine_advice, machine_report_tables); and host_room, the
// host memory the process may still take (the offloaded optimizer's check).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/build_info.hpp"
#include "base/errors.hpp"
#include "device/cuda_driver_probe.hpp"
#include "device/host_memory_probe.hpp"
#include "device/machine_advice.hpp"
#include "device/machine_report.hpp"
#include "device/numa_topology.hpp"
#include "device/nvidia_smi_listing.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace stowage::python {

namespace {

py::dict to_dict(const NumaNode& node) {
  return py::dict("os_index"_a = node.os_index, "local_memory"_a = node.local_memory, "cpus"_a = node.cpus,
                  "allowed"_a = node.allowed);
}

py::dict to_dict(const PciLocality& device) {
  return py::dict("bus_id"_a = device.bus_id, "found"_a = device.found, "vendor_id"_a = device.vendor_id,
                  "device_id"_a = device.device_id, "numa_nodes"_a = device.numa_nodes, "cpus"_a = device.cpus);
}

py::dict to_dict(const GpuFacts& gpu, const char* source = "driver") {
  return py::dict("index"_a = gpu.index, "name"_a = gpu.name, "total_memory"_a = gpu.total_memory,
                  "pci_bus_id"_a = gpu.pci_bus_id, "compute_capability"_a = gpu.compute_capability,
                  "virtual_memory_management"_a = gpu.virtual_memory_management, "source"_a = source);
}

template <typename T>
py::list dicts_of(const std::vector<T>& rows) {
  py::list out;
  for (const T& row : rows) out.append(to_dict(row));
  return out;
}

py::dict to_dict(const NumaTopology& topology) {
  return py::dict("hwloc_api_version"_a = topology.hwloc_api_version, "packages"_a = topology.packages,
                  "cores"_a = topology.cores, "processing_units"_a = topology.processing_units,
                  "nodes"_a = dicts_of(topology.nodes), "process_cpus"_a = topology.process_cpus,
                  "process_numa_nodes"_a = topology.process_numa_nodes,
                  "pci_devices"_a = dicts_of(topology.pci_devices));
}

py::tuple to_python(const CudaDriverFacts& facts) {
  return py::make_tuple(py::dict("library"_a = facts.library, "version"_a = facts.version,
                                 "device_count"_a = facts.device_count, "error"_a = facts.error),
                        dicts_of(facts.gpus));
}

py::dict to_dict(const CudaRuntimeFacts& facts) {
  return py::dict("library"_a = facts.library, "version"_a = facts.version, "device_count"_a = facts.device_count,
                  "error"_a = facts.error);
}

py::dict to_dict(const HostMemoryFacts& facts) {
  return py::dict("total"_a = facts.physical_bytes, "available"_a = facts.available_bytes,
                  "cgroup_room"_a = facts.cgroup_room_bytes, "memlock_soft"_a = facts.memlock_soft,
                  "memlock_hard"_a = facts.memlock_hard);
}

void bind_machine_probes(py::module_& module) {
  module.def(
      "cuda_driver", [] { return to_python(probe_cuda_driver()); },
      "(facts, gpus): the NVIDIA driver (library, version, device_count, error: why there are no "
      "GPUs) and each GPU it reports (index, name, total_memory, pci_bus_id, compute_capability, "
      "virtual_memory_management), asked through dlopen; creates no CUDA context.");
  module.def(
      "nvidia_smi_gpus",
      [](std::string_view listing) {
        py::list gpus;
        for (const GpuFacts& gpu : nvidia_smi_gpus(listing)) gpus.append(to_dict(gpu, "nvidia-smi"));
        return gpus;
      },
      py::arg("listing"),
      "The GPUs in nvidia-smi's --query-gpu=index,name,memory.total,pci.bus_id,compute_cap "
      "--format=csv,noheader,nounits output (device/nvidia_smi_listing.hpp), as cuda_driver's gpus.");
  module.def(
      "cuda_runtime", [](const std::vector<std::string>& candidates) { return to_dict(probe_cuda_runtime(candidates)); },
      py::arg("candidates"),
      "The first CUDA runtime of `candidates` that loads: library, version, device_count, error.");
  module.def(
      "host_memory", [] { return to_dict(read_host_memory()); },
      "Host memory in bytes: total, available (MemAvailable), cgroup_room (the cgroup's limit less "
      "its usage), memlock_soft and memlock_hard (RLIMIT_MEMLOCK); None where unknown or unlimited.");
  py::class_<HostRoom>(module, "HostRoom", "The host memory the process may still take, and which limit set it.")
      .def_readonly("available_bytes", &HostRoom::available_bytes)
      .def_readonly("limited_by", &HostRoom::limited_by)
      .def_readonly("lockable_bytes", &HostRoom::lockable_bytes, "RLIMIT_MEMLOCK; None: unlimited");
  module.def(
      "host_room",
      [](std::optional<std::uint64_t> limit_bytes) { return host_room(read_host_memory(), limit_bytes); },
      py::arg("limit_bytes") = py::none(),
      "The smallest of MemAvailable, the cgroup's room and limit_bytes (a HostRoom).");
}

// A report's text fact: None unknown, anything else as str() writes it.
std::optional<std::string> text_of(const py::handle& value) {
  if (value.is_none()) return std::nullopt;
  return py::str(value).cast<std::string>();
}

bool truthy(const py::handle& value) {
  const int truth = PyObject_IsTrue(value.ptr());
  if (truth < 0) throw py::error_already_set();
  return truth == 1;
}

AdvisedGpu gpu_of(const py::handle& gpu) {
  const py::handle vmm = gpu["virtual_memory_management"], nodes = gpu["numa_nodes"];
  return {gpu["index"].cast<std::int64_t>(), text_of(gpu["name"]), py::str("nvidia-smi").equal(gpu["source"]),
          py::isinstance<py::bool_>(vmm) ? std::optional<bool>(vmm.cast<bool>()) : std::nullopt,
          text_of(gpu["pci_bus_id"]),
          nodes.is_none() ? std::nullopt : std::optional(nodes.cast<std::vector<std::int64_t>>()),
          text_of(gpu["near_cpus"])};
}

// `stowage doctor`'s report (stowage.doctor.gather's dict) as the advice reads it.
MachineFacts facts_of(const py::dict& report) {
  MachineFacts facts;
  facts.stowage_with_cuda = truthy(report["stowage"]["with_cuda"]);
  const py::handle driver = report["cuda"]["driver"], runtime = report["cuda"]["runtime"];
  facts.driver_error = text_of(driver["error"]);
  facts.driver_version = text_of(driver["version"]);
  facts.runtime_version = text_of(runtime["version"]);
  facts.runtime_library = text_of(runtime["library"]);
  const py::object visible = py::module_::import("os").attr("environ").attr("get")("CUDA_VISIBLE_DEVICES");
  if (!visible.is_none()) facts.cuda_visible_devices = py::repr(visible).cast<std::string>();
  for (const py::handle gpu : report["gpus"]) facts.gpus.push_back(gpu_of(gpu));
  const py::handle torch = report["torch"];
  const py::object module = truthy(torch["stowage_module"]) ? py::reinterpret_borrow<py::object>(torch["stowage_module"])
                                                            : py::dict();
  const py::object field = module.attr("get");
  facts.torch = {truthy(torch["installed"]), text_of(torch["version"]), text_of(torch["cuda_build"]),
                 truthy(field("importable")), text_of(field("error")), text_of(field("built_for_torch")),
                 truthy(field("matches_torch")), truthy(field("cuda_allocator_built")), text_of(torch["error"])};
  const py::handle memory = report["host_memory"];
  facts.memlock_soft = memory["memlock_soft"].cast<std::optional<std::uint64_t>>();
  facts.memlock_hard = memory["memlock_hard"].cast<std::optional<std::uint64_t>>();
  facts.total_memory = memory["total"].cast<std::uint64_t>();
  const py::handle numa = report["numa"];
  facts.numa_error = text_of(numa["error"]);
  facts.process_cpus = text_of(numa["process_cpus"]);
  facts.process_numa_nodes = numa["process_numa_nodes"].cast<std::vector<std::int64_t>>();
  return facts;
}

template <typename T>
T field_of(const py::handle& dict, const char* key) {
  return dict[key].cast<T>();
}

GpuFacts gpu_facts_of(const py::handle& gpu) {
  return {field_of<int>(gpu, "index"), text_of(gpu["name"]),
          field_of<std::optional<std::uint64_t>>(gpu, "total_memory"), text_of(gpu["pci_bus_id"]),
          text_of(gpu["compute_capability"]), field_of<std::optional<bool>>(gpu, "virtual_memory_management")};
}

TorchReport torch_report_of(const py::handle& torch) {
  TorchReport out{truthy(torch["installed"]), text_of(torch["error"]), text_of(torch["version"]),
                  text_of(torch["cuda_build"]), field_of<std::optional<std::int64_t>>(torch, "cuda_device_count"),
                  {}, {}};
  for (const auto& [name, value] : torch["environment"].cast<py::dict>()) {
    out.environment.emplace_back(py::str(name).cast<std::string>(), py::repr(value).cast<std::string>());
  }
  if (!out.installed) return out;
  const py::handle module = torch["stowage_module"];
  out.module = {truthy(module["importable"]), text_of(module["error"]), text_of(module["built_for_torch"]),
                truthy(module["matches_torch"]), truthy(module["cuda_allocator_built"]),
                field_of<std::vector<std::string>>(module, "cuda_torch_versions"),
                truthy(module["cuda_allocator_enabled"]), truthy(module["cpu_allocator_enabled"])};
  return out;
}

// `stowage doctor`'s report (stowage.doctor.gather's dict) as its tables read it.
MachineReport report_of(const py::dict& report) {
  MachineReport out;
  const py::handle driver = report["cuda"]["driver"], runtime = report["cuda"]["runtime"];
  out.driver = {text_of(driver["library"]), text_of(driver["version"]), field_of<int>(driver, "device_count"),
                text_of(driver["error"]), {}};
  out.runtime = {text_of(runtime["library"]), text_of(runtime["version"]),
                 field_of<std::optional<int>>(runtime, "device_count"), text_of(runtime["error"])};
  for (const py::handle gpu : report["gpus"]) {
    out.gpus.push_back({gpu_facts_of(gpu), field_of<std::optional<std::vector<std::int64_t>>>(gpu, "numa_nodes")});
  }
  out.torch = torch_report_of(report["torch"]);
  const py::handle memory = report["host_memory"], numa = report["numa"];
  out.memory = {field_of<std::uint64_t>(memory, "total"), field_of<std::optional<std::uint64_t>>(memory, "available"),
                field_of<std::optional<std::uint64_t>>(memory, "cgroup_room"),
                field_of<std::optional<std::uint64_t>>(memory, "memlock_soft"),
                field_of<std::optional<std::uint64_t>>(memory, "memlock_hard")};
  out.numa_error = text_of(numa["error"]);
  if (out.numa_error) return out;
  out.numa.hwloc_api_version = field_of<std::string>(numa, "hwloc_api_version");
  out.numa.packages = field_of<unsigned>(numa, "packages");
  out.numa.cores = field_of<unsigned>(numa, "cores");
  out.numa.processing_units = field_of<unsigned>(numa, "processing_units");
  out.numa.process_cpus = field_of<std::string>(numa, "process_cpus");
  out.numa.process_numa_nodes = field_of<std::vector<unsigned>>(numa, "process_numa_nodes");
  for (const py::handle node : numa["nodes"]) {
    out.numa.nodes.push_back({field_of<unsigned>(node, "os_index"), field_of<std::uint64_t>(node, "local_memory"),
                              field_of<std::string>(node, "cpus"), truthy(node["allowed"])});
  }
  return out;
}

}  // namespace

void bind_topology(py::module_& module) {
  module.def(
      "machine_report_tables",
      [](const py::dict& report) {
        py::list tables;
        for (const FactsTable& table : machine_report_tables(report_of(report))) {
          tables.append(py::make_tuple(table.title, table.columns, table.rows));
        }
        return tables;
      },
      py::arg("report"),
      "stowage doctor's report (stowage.doctor.gather's dict) as the tables it prints "
      "(device/machine_report.hpp): (title, columns, rows) each, no columns for a table of (fact, value) rows.");
  module.def(
      "machine_advice", [](const py::dict& report) { return machine_advice(facts_of(report)); }, py::arg("report"),
      "stowage doctor's advice (device/machine_advice.hpp) over its report (stowage.doctor.gather's dict): one "
      "line per thing on this machine that limits stowage.");
  bind_machine_probes(module);
  module.def(
      "numa_topology",
      [](const std::vector<std::string>& pci_bus_ids) {
        NumaTopology topology;
        {
          py::gil_scoped_release unlocked;
          topology = read_numa_topology(pci_bus_ids);
        }
        return to_dict(topology);
      },
      py::arg("pci_bus_ids") = std::vector<std::string>{},
      "The NUMA nodes (os_index, local_memory bytes, cpus, allowed), the CPU and NUMA nodes this "
      "process runs on, and for each PCI bus id ('0000:3b:00.0') its nearest NUMA nodes, read "
      "through hwloc. Raises LogicError for a malformed bus id, BackendError if hwloc fails.");
  module.def(
      "is_pci_bus_id",
      [](const std::string& text) {
        try {
          parse_pci_bus_id(text);
          return true;
        } catch (const LogicError&) {
          return false;
        }
      },
      py::arg("text"), "Whether `text` is a PCI bus id numa_topology takes ([domain:]bus:device.function, hex).");
  module.def(
      "build_info",
      [] {
        return py::dict("version"_a = std::string(build_info::kVersion),
                        "build_type"_a = std::string(build_info::kBuildType),
                        "compiler"_a = std::string(build_info::kCompiler),
                        "sanitizer"_a = std::string(build_info::kSanitizer), "with_cuda"_a = build_info::kWithCuda,
                        "cuda_version"_a = std::string(build_info::kCudaVersion),
                        "with_torch"_a = build_info::kWithTorch,
                        "torch_version"_a = std::string(build_info::kTorchVersion));
      },
      "How this copy of stowage was built: version, build type, compiler, sanitizer, and the "
      "CUDA toolkit and torch it was built with.");
}

}  // namespace stowage::python
