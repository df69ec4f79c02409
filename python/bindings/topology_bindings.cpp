// stowage._core.numa_topology and stowage._core.build_info: facts for `stowage doctor`, as
// plain dicts and lists.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "allocator/base/build_info.hpp"
#include "allocator/device/numa_topology.hpp"
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

}  // namespace

void bind_topology(py::module_& module) {
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
