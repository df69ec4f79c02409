#include "device/numa_host_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <sstream>
#include <utility>

#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/numbers.hpp"
#include "device/hwloc_handles.hpp"
#include "device/numa_topology.hpp"

namespace stowage {

NumaHostMemory NumaHostMemory::near_device(const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) return NumaHostMemory({}, "no PCI device to be near");
  NumaTopology topology;
  try {
    topology = read_numa_topology({pci_bus_id});
  } catch (const BackendError& error) {
    return NumaHostMemory({}, detail::concat("hwloc cannot read the machine: ", error.what()));
  }
  const PciLocality& device = topology.pci_devices.front();
  if (!device.found) {
    return NumaHostMemory({}, detail::concat("hwloc does not list ", pci_bus_id));
  }
  if (topology.nodes.size() < 2) return NumaHostMemory({}, "the machine has one NUMA node");
  if (device.numa_nodes.empty()) {
    return NumaHostMemory({}, detail::concat("hwloc places ", pci_bus_id, " near no NUMA node"));
  }
  return on_nodes(device.numa_nodes);
}

NumaHostMemory NumaHostMemory::on_nodes(std::vector<unsigned> nodes, std::string why_unbound) {
  if (nodes.empty() && why_unbound.empty()) why_unbound = "no NUMA node was asked for";
  return NumaHostMemory(std::move(nodes), std::move(why_unbound));
}

NumaHostMemory::NumaHostMemory(std::vector<unsigned> nodes, std::string why_unbound)
    : nodes_(std::move(nodes)), why_unbound_(std::move(why_unbound)) {
  if (nodes_.empty()) return;
  try {
    topology_ = std::make_unique<hwloc::Topology>(/*with_io=*/false);
  } catch (const BackendError& error) {
    nodes_.clear();
    why_unbound_ = detail::concat("hwloc cannot read the machine: ", error.what());
  }
}

NumaHostMemory::NumaHostMemory(NumaHostMemory&&) noexcept = default;
NumaHostMemory& NumaHostMemory::operator=(NumaHostMemory&&) noexcept = default;
NumaHostMemory::~NumaHostMemory() = default;

std::size_t NumaHostMemory::page_size() noexcept {
  static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

void* NumaHostMemory::try_allocate(std::size_t bytes) {
  STOWAGE_CHECK(bytes > 0, "host memory of 0 bytes");
  if (bytes > (std::size_t{1} << 56)) return nullptr;
  const std::size_t size = round_up(bytes, page_size());
  void* ptr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ptr == MAP_FAILED) return nullptr;
  if (!nodes_.empty()) bind(ptr, size);
  return ptr;
}

void NumaHostMemory::free(void* ptr, std::size_t bytes) noexcept {
  if (ptr != nullptr) ::munmap(ptr, round_up(bytes, page_size()));
}

void NumaHostMemory::bind(void* ptr, std::size_t bytes) {
  const hwloc::Bitmap set = hwloc::make_bitmap();
  for (const unsigned node : nodes_) hwloc_bitmap_set(set.get(), node);
  if (hwloc_set_area_membind(topology_->get(), ptr, bytes, set.get(), HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET) == 0) {
    return;
  }
  why_unbound_ = detail::concat("the kernel refused to bind memory to ", placement(), ": ",
                                hwloc::errno_text());
  nodes_.clear();
  log_warning(detail::concat("host memory is placed anywhere: ", why_unbound_));
}

std::string NumaHostMemory::placement() const {
  if (nodes_.empty()) return "anywhere (" + why_unbound_ + ")";
  std::ostringstream out;
  out << (nodes_.size() == 1 ? "NUMA node " : "NUMA nodes ");
  for (std::size_t i = 0; i < nodes_.size(); ++i) out << (i == 0 ? "" : ",") << nodes_[i];
  return out.str();
}

}  // namespace stowage
