// NumaHostMemory: host memory placed on the NUMA nodes nearest a GPU.
//
// On a machine with several sockets, a GPU hangs off one of them; copies between it and host
// memory on another socket cross the socket link and lose bandwidth. NumaHostMemory hands out
// anonymous mappings bound (hwloc_set_area_membind, HWLOC_MEMBIND_BIND) to the nodes nearest the
// GPU, found by its PCI bus id (numa_topology.hpp), before any page is touched, so the pages land
// there when first touched (cudaHostRegister touches them all). Where the placement cannot be
// chosen (a simulated device has no bus id; hwloc does not list the GPU; the machine has one
// node; the kernel refuses binding in a container) the memory is plain anonymous memory and
// placement() says why.
//
// Contract: not thread-safe; its owner serializes calls (a PinnedSegments does, under its
// allocator's lock). Memory is page-aligned and zero-filled; free() takes the pointer and the
// size try_allocate was given.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace stowage {

namespace hwloc {
class Topology;
}

class NumaHostMemory {
 public:
  // Memory near the PCI device `pci_bus_id` ("0000:3b:00.0"); empty: no device to be near.
  // Throws LogicError for a bus id that does not parse.
  static NumaHostMemory near_device(const std::string& pci_bus_id);
  // Memory bound to the given NUMA nodes (OS indexes); empty: unbound.
  static NumaHostMemory on_nodes(std::vector<unsigned> nodes, std::string why_unbound = "");

  NumaHostMemory(NumaHostMemory&&) noexcept;
  NumaHostMemory& operator=(NumaHostMemory&&) noexcept;
  ~NumaHostMemory();

  // `bytes` rounded up to whole pages; nullptr when the host has no memory (or address space)
  // left.
  void* try_allocate(std::size_t bytes);
  void free(void* ptr, std::size_t bytes) noexcept;

  // The NUMA nodes memory is bound to (OS indexes); empty when unbound.
  const std::vector<unsigned>& nodes() const noexcept { return nodes_; }
  // "NUMA node 1", or "anywhere (<why>)".
  std::string placement() const;
  // The host's page size: what sizes and addresses are multiples of.
  static std::size_t page_size() noexcept;

 private:
  NumaHostMemory(std::vector<unsigned> nodes, std::string why_unbound);
  // Binds [ptr, ptr + bytes) to nodes_; on the kernel's refusal, stops binding (logged once).
  void bind(void* ptr, std::size_t bytes);

  std::vector<unsigned> nodes_;
  std::string why_unbound_;
  std::unique_ptr<hwloc::Topology> topology_;  // loaded when nodes_ is not empty
};

}  // namespace stowage
