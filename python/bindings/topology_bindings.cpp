// Facts about the machine, as plain dicts and lists (JSON-ready, for `stowage doctor`):
// stowage._core.numa_topology, build_info, cuda_driver, cuda_runtime and host_memory; and
// host_room, the host memory the process may still take (the offloaded optimizer's check).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/build_info.hpp"
#include "device/cuda_driver_probe.hpp"
#include "device/host_memory_probe.hpp"
#include "device/numa_topology.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;

namespace stowage::python {

namespace {

py::dict to_dict(const NumaNode& node) {
  py::dict out;
  out["os_index"] = node.os_index;
  out["local_memory"] = node.local_memory;
  out["cpus"] = node.cpus;
  out["allowed"] = node.allowed;
  return out;
}

py::dict to_dict(const PciLocality& device) {
  py::dict out;
  out["bus_id"] = device.bus_id;
  out["found"] = device.found;
  out["vendor_id"] = device.vendor_id;
  out["device_id"] = device.device_id;
  out["numa_nodes"] = device.numa_nodes;
  out["cpus"] = device.cpus;
  return out;
}

py::dict to_dict(const NumaTopology& topology) {
  py::dict out;
  out["hwloc_api_version"] = topology.hwloc_api_version;
  out["packages"] = topology.packages;
  out["cores"] = topology.cores;
  out["processing_units"] = topology.processing_units;
  py::list nodes;
  for (const NumaNode& node : topology.nodes) {
    nodes.append(to_dict(node));
  }
  out["nodes"] = nodes;
  out["process_cpus"] = topology.process_cpus;
  out["process_numa_nodes"] = topology.process_numa_nodes;
  py::list devices;
  for (const PciLocality& device : topology.pci_devices) {
    devices.append(to_dict(device));
  }
  out["pci_devices"] = devices;
  return out;
}

py::dict to_dict(const GpuFacts& gpu) {
  py::dict out;
  out["index"] = gpu.index;
  out["name"] = gpu.name;
  out["total_memory"] = gpu.total_memory;
  out["pci_bus_id"] = gpu.pci_bus_id;
  out["compute_capability"] = gpu.compute_capability;
  out["virtual_memory_management"] = gpu.virtual_memory_management;
  out["source"] = "driver";
  return out;
}

py::tuple to_python(const CudaDriverFacts& facts) {
  py::dict out;
  out["library"] = facts.library;
  out["version"] = facts.version;
  out["device_count"] = facts.device_count;
  out["error"] = facts.error;
  py::list gpus;
  for (const GpuFacts& gpu : facts.gpus) {
    gpus.append(to_dict(gpu));
  }
  return py::make_tuple(out, gpus);
}

py::dict to_dict(const CudaRuntimeFacts& facts) {
  py::dict out;
  out["library"] = facts.library;
  out["version"] = facts.version;
  out["device_count"] = facts.device_count;
  out["error"] = facts.error;
  return out;
}

py::dict to_dict(const HostMemoryFacts& facts) {
  py::dict out;
  out["total"] = facts.physical_bytes;
  out["available"] = facts.available_bytes;
  out["cgroup_room"] = facts.cgroup_room_bytes;
  out["memlock_soft"] = facts.memlock_soft;
  out["memlock_hard"] = facts.memlock_hard;
  return out;
}

void bind_machine_probes(py::module_& module) {
  module.def(
      "cuda_driver", [] { return to_python(probe_cuda_driver()); },
      "(facts, gpus): the NVIDIA driver (library, version, device_count, error: why there are no "
      "GPUs) and each GPU it reports (index, name, total_memory, pci_bus_id, compute_capability, "
      "virtual_memory_management), asked through dlopen; creates no CUDA context.");
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
      .def_readonly("lockable_bytes", &HostRoom::lockable_bytes, "RLIMIT_MEMLOCK; None: unlimited")
      .def("__repr__", [](const HostRoom& room) {
        return "HostRoom(available_bytes=" + std::to_string(room.available_bytes) + ", limited_by='" +
               room.limited_by + "')";
      });
  module.def(
      "host_room",
      [](std::optional<std::uint64_t> limit_bytes) { return host_room(read_host_memory(), limit_bytes); },
      py::arg("limit_bytes") = py::none(),
      "The smallest of MemAvailable, the cgroup's room and limit_bytes (a HostRoom).");
}

}  // namespace

void bind_topology(py::module_& module) {
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
      "build_info",
      [] {
        py::dict out;
        out["version"] = std::string(build_info::kVersion);
        out["build_type"] = std::string(build_info::kBuildType);
        out["compiler"] = std::string(build_info::kCompiler);
        out["sanitizer"] = std::string(build_info::kSanitizer);
        out["with_cuda"] = build_info::kWithCuda;
        out["cuda_version"] = std::string(build_info::kCudaVersion);
        out["with_torch"] = build_info::kWithTorch;
        out["torch_version"] = std::string(build_info::kTorchVersion);
        return out;
      },
      "How this copy of stowage was built: version, build type, compiler, sanitizer, and the "
      "CUDA toolkit and torch it was built with.");
}

}  // namespace stowage::python
