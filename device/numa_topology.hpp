// The machine's NUMA layout, and where PCI devices (GPUs) sit in it, read through hwloc; for
// `stowage doctor`.
//
// read_numa_topology() loads a fresh hwloc topology, reads it and frees it: nothing is cached,
// so each call sees the machine as it is then, and calls from several threads are safe. NUMA
// nodes the process may not use (cgroups, cpusets) are listed too, marked allowed = false, so
// the list matches /sys/devices/system/node. Debian's hwloc has no CUDA plugin: a GPU is found
// as a PCI device by its bus id ("0000:3b:00.0", the form CUDA and nvidia-smi print), and its
// nearest NUMA nodes are those of its first non-I/O ancestor (the package or group its host
// bridge hangs from). A bus id hwloc does not list (a container without /sys/bus/pci) is not an
// error: its PciLocality has found == false.
// Throws LogicError for a bus id that does not parse, BackendError when hwloc cannot load the
// topology.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stowage {

struct NumaNode {
  unsigned os_index = 0;           // the number Linux gives it: /sys/devices/system/node/nodeN
  std::uint64_t local_memory = 0;  // bytes
  std::string cpus;                // its CPUs' OS indexes in list form, "0-15,32-47"
  bool allowed = true;             // in this process's allowed nodeset
};

struct PciLocality {
  std::string bus_id;  // as asked
  bool found = false;  // hwloc lists a PCI device with this bus id
  unsigned vendor_id = 0;
  unsigned device_id = 0;
  std::vector<unsigned> numa_nodes;  // OS indexes of its nearest NUMA nodes; empty if not found
  std::string cpus;                  // the CPUs of its non-I/O ancestor, list form
};

struct NumaTopology {
  std::string hwloc_api_version;  // of the hwloc library loaded at run time, "2.8.0"
  unsigned packages = 0;
  unsigned cores = 0;
  unsigned processing_units = 0;
  std::vector<NumaNode> nodes;                // by OS index
  std::string process_cpus;                   // the CPUs this process is bound to, list form
  std::vector<unsigned> process_numa_nodes;   // the NUMA nodes of those CPUs
  std::vector<PciLocality> pci_devices;       // one per bus id asked, in the order asked
};

// The parts of a PCI bus id "[domain:]bus:device.function", all hexadecimal.
struct PciBusId {
  unsigned domain = 0;
  unsigned bus = 0;
  unsigned device = 0;
  unsigned function = 0;
};

// Throws LogicError naming `text` when it is not a PCI bus id.
PciBusId parse_pci_bus_id(const std::string& text);

NumaTopology read_numa_topology(const std::vector<std::string>& pci_bus_ids);

}  // namespace stowage
