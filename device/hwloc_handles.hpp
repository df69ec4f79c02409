// RAII for hwloc's objects, shared by the device layer's hwloc users (numa_topology.cpp,
// numa_host_memory.cpp). Internal to stowage_device.
//
// Contract: a Topology is loaded once and then only read; hwloc allows concurrent reads of a
// loaded topology, so one may serve several threads. Errors throw BackendError naming the call.
#pragma once

#include <hwloc.h>

#include <cerrno>
#include <memory>
#include <new>
#include <string>
#include <system_error>

#include "base/errors.hpp"

namespace stowage::hwloc {

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* set) const noexcept { hwloc_bitmap_free(set); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

inline Bitmap make_bitmap() {
  Bitmap set(hwloc_bitmap_alloc());
  if (!set) throw std::bad_alloc();
  return set;
}

inline std::string errno_text() {
  return std::error_code(errno, std::generic_category()).message();
}

// One topology; `with_io` keeps every PCI device and every NUMA node (allowed or not).
class Topology {
 public:
  explicit Topology(bool with_io) {
    if (hwloc_topology_init(&topology_) != 0) {
      STOWAGE_THROW(BackendError, "hwloc_topology_init failed: ", errno_text());
    }
    try {
      load(with_io);
    } catch (...) {
      hwloc_topology_destroy(topology_);
      throw;
    }
  }
  ~Topology() { hwloc_topology_destroy(topology_); }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  hwloc_topology_t get() const noexcept { return topology_; }

 private:
  void load(bool with_io) {
    if (with_io &&
        (hwloc_topology_set_flags(topology_, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED) != 0 ||
         hwloc_topology_set_io_types_filter(topology_, HWLOC_TYPE_FILTER_KEEP_ALL) != 0)) {
      STOWAGE_THROW(BackendError, "hwloc: cannot configure the topology: ", errno_text());
    }
    if (hwloc_topology_load(topology_) != 0) {
      STOWAGE_THROW(BackendError, "hwloc_topology_load failed: ", errno_text());
    }
  }

  hwloc_topology_t topology_ = nullptr;
};

}  // namespace stowage::hwloc
