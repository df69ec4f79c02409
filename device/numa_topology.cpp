#include "device/numa_topology.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include "base/errors.hpp"
#include "device/hwloc_handles.hpp"

namespace stowage {

namespace {

using hwloc::Bitmap;
using hwloc::make_bitmap;

struct FreeDeleter {
  void operator()(char* text) const noexcept { std::free(text); }
};

std::string list_of(hwloc_const_bitmap_t set) {
  char* raw = nullptr;
  if (hwloc_bitmap_list_asprintf(&raw, set) < 0 || raw == nullptr) {
    throw std::bad_alloc();
  }
  const std::unique_ptr<char, FreeDeleter> text(raw);
  return std::string(text.get());
}

// The indexes in `set`, which must be finite (intersected with a topology's complete set).
std::vector<unsigned> indexes_of(hwloc_const_bitmap_t set) {
  std::vector<unsigned> out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) {
    out.push_back(static_cast<unsigned>(i));
  }
  return out;
}

unsigned count_of(hwloc_topology_t topology, hwloc_obj_type_t type) {
  return static_cast<unsigned>(std::max(0, hwloc_get_nbobjs_by_type(topology, type)));
}

bool parse_hex(std::string_view text, unsigned max, unsigned& out) {
  if (text.empty() || text.size() > 8) {
    return false;
  }
  unsigned value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value, 16);
  if (error != std::errc{} || stop != end || value > max) {
    return false;
  }
  out = value;
  return true;
}

std::vector<NumaNode> read_nodes(hwloc_topology_t topology) {
  std::vector<NumaNode> nodes;
  hwloc_const_nodeset_t allowed = hwloc_topology_get_allowed_nodeset(topology);
  for (hwloc_obj_t node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, nullptr);
       node != nullptr; node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, node)) {
    NumaNode out;
    out.os_index = node->os_index;
    out.local_memory = node->attr != nullptr ? node->attr->numanode.local_memory : 0;
    out.cpus = node->cpuset != nullptr ? list_of(node->cpuset) : "";
    out.allowed = hwloc_bitmap_isset(allowed, node->os_index) != 0;
    nodes.push_back(std::move(out));
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
  return nodes;
}

PciLocality locate(hwloc_topology_t topology, const std::string& bus_id) {
  const PciBusId id = parse_pci_bus_id(bus_id);
  PciLocality out;
  out.bus_id = bus_id;
  const hwloc_obj_t device =
      hwloc_get_pcidev_by_busid(topology, id.domain, id.bus, id.device, id.function);
  if (device == nullptr) {
    return out;
  }
  out.found = true;
  if (device->attr != nullptr) {
    out.vendor_id = device->attr->pcidev.vendor_id;
    out.device_id = device->attr->pcidev.device_id;
  }
  const hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, device);
  if (ancestor != nullptr && ancestor->nodeset != nullptr && ancestor->cpuset != nullptr) {
    const Bitmap nodes = make_bitmap();
    hwloc_bitmap_and(nodes.get(), ancestor->nodeset, hwloc_topology_get_complete_nodeset(topology));
    out.numa_nodes = indexes_of(nodes.get());
    out.cpus = list_of(ancestor->cpuset);
  }
  return out;
}

}  // namespace

PciBusId parse_pci_bus_id(const std::string& text) {
  // "[domain:]bus:device.function"; CUDA writes an 8-digit domain, Linux a 4-digit one.
  const std::string_view all(text);
  PciBusId id;
  const auto dot = all.rfind('.');
  const auto last_colon = all.rfind(':', dot);
  bool ok = dot != std::string_view::npos && last_colon != std::string_view::npos &&
            last_colon < dot && parse_hex(all.substr(dot + 1), 0x7, id.function) &&
            parse_hex(all.substr(last_colon + 1, dot - last_colon - 1), 0x1f, id.device);
  if (ok) {
    const std::string_view head = all.substr(0, last_colon);  // "domain:bus" or "bus"
    const auto colon = head.find(':');
    if (colon == std::string_view::npos) {
      ok = parse_hex(head, 0xff, id.bus);
    } else {
      ok = parse_hex(head.substr(0, colon), 0xffffffffU, id.domain) &&
           parse_hex(head.substr(colon + 1), 0xff, id.bus);
    }
  }
  STOWAGE_CHECK(ok, "'", text,
                "' is not a PCI bus id (domain:bus:device.function, e.g. 0000:3b:00.0)");
  return id;
}

NumaTopology read_numa_topology(const std::vector<std::string>& pci_bus_ids) {
  for (const std::string& bus_id : pci_bus_ids) {
    parse_pci_bus_id(bus_id);  // a bad id is the caller's error: report it before loading
  }
  const hwloc::Topology topology(/*with_io=*/true);
  const hwloc_topology_t t = topology.get();

  NumaTopology out;
  const unsigned api = hwloc_get_api_version();
  out.hwloc_api_version = std::to_string(api >> 16) + "." + std::to_string((api >> 8) & 0xffU) +
                          "." + std::to_string(api & 0xffU);
  out.packages = count_of(t, HWLOC_OBJ_PACKAGE);
  out.cores = count_of(t, HWLOC_OBJ_CORE);
  out.processing_units = count_of(t, HWLOC_OBJ_PU);
  out.nodes = read_nodes(t);

  // Where this process runs; without binding support, wherever it is allowed to.
  const Bitmap cpus = make_bitmap();
  if (hwloc_get_cpubind(t, cpus.get(), HWLOC_CPUBIND_PROCESS) != 0) {
    hwloc_bitmap_copy(cpus.get(), hwloc_topology_get_allowed_cpuset(t));
  }
  hwloc_bitmap_and(cpus.get(), cpus.get(), hwloc_topology_get_complete_cpuset(t));
  const Bitmap nodes = make_bitmap();
  hwloc_cpuset_to_nodeset(t, cpus.get(), nodes.get());
  hwloc_bitmap_and(nodes.get(), nodes.get(), hwloc_topology_get_complete_nodeset(t));
  out.process_cpus = list_of(cpus.get());
  out.process_numa_nodes = indexes_of(nodes.get());

  for (const std::string& bus_id : pci_bus_ids) {
    out.pci_devices.push_back(locate(t, bus_id));
  }
  return out;
}

}  // namespace stowage
