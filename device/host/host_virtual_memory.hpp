// Virtual memory of the simulated device: reservations, physical handles, mappings, and CUDA's
// rules for them (Note [Host virtual memory]).
//
// Note [Host virtual memory]
// A reservation is a PROT_NONE, MAP_NORESERVE range of host address space, so it costs no RAM.
// Mapping a handle replaces part of it with a MAP_SHARED|MAP_FIXED view of the handle's range of
// the device file (Note [Host physical memory]), still PROT_NONE; set_access makes it read-write;
// unmap puts a fresh PROT_NONE reservation back. Because every view of a handle maps the same
// file range, two virtual addresses of one handle really see the same bytes, and memory touched
// before set_access faults, as it does on a GPU.
//
// CUDA's rules are enforced, each failure a LogicError naming the rule: sizes and addresses are
// multiples of the granularity; a handle is mapped whole at offset 0 into reserved, unmapped
// space; set_access and unmap cover whole adjacent mappings, never part of one; a released
// handle keeps its memory until its last mapping is unmapped; a reservation is released whole
// and only once empty. stowage is stricter than CUDA in one place: set_access must cover whole
// mappings (CUDA allows sub-ranges), which keeps every mapping a single kernel VMA.
//
// Contract: not thread-safe (HostBackend serialises all calls under its memory lock). Owns its
// reservations and the physical memory file; unmaps and releases everything when destroyed.
// Invariant: physical_bytes() == sum of the sizes of handles not yet freed, where a handle is
// freed once it is released and has no mapping; every mapping lies inside its reservation and
// refers to a live handle whose mapping count includes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory_resource>
#include <optional>
#include <unordered_map>

#include "device/backend.hpp"
#include "device/host/host_physical_memory.hpp"

namespace stowage {

class HostVirtualMemory {
 public:
  // x86-64 and AArch64 user address space: no reservation can be larger.
  static constexpr std::size_t kMaxReservation = std::size_t{1} << 47;

  // capacity_bytes sizes the physical file; granularity is a multiple of the host page size.
  // release_freed_memory and back_mappings: as in HostBackendOptions.
  HostVirtualMemory(std::size_t capacity_bytes, std::size_t granularity,
                    bool release_freed_memory, bool back_mappings);
  ~HostVirtualMemory();
  HostVirtualMemory(const HostVirtualMemory&) = delete;
  HostVirtualMemory& operator=(const HostVirtualMemory&) = delete;

  std::size_t granularity() const noexcept { return granularity_; }

  void* reserve(std::size_t bytes, std::size_t alignment);
  void release_reservation(void* base, std::size_t bytes);
  // Capacity is HostBackend's to enforce; this fails only when the device file has no room.
  std::optional<PhysicalHandle> try_create(std::size_t bytes);
  void release(PhysicalHandle handle);
  void map(void* address, std::size_t bytes, PhysicalHandle handle, std::size_t handle_offset);
  void set_access(void* address, std::size_t bytes);
  void unmap(void* address, std::size_t bytes);

  // Bytes of physical memory held: live handles plus released handles still mapped.
  std::size_t physical_bytes() const noexcept { return physical_.allocated_bytes(); }
  std::size_t reservation_count() const noexcept { return reservations_.size(); }
  // Kernel mappings the handles' mappings take (none when mappings are not backed).
  std::size_t kernel_mapping_count() const noexcept { return back_mappings_ ? mapping_count_ : 0; }

  // True when `address` lies inside a reservation.
  bool reserved(const void* address) const;
  // Throws LogicError unless [address, address + bytes) is mapped and accessible throughout.
  void check_accessible(const void* address, std::size_t bytes) const;

  void check_invariants() const;

 private:
  struct Handle {
    std::size_t file_offset = 0;
    std::size_t bytes = 0;
    std::size_t mappings = 0;
    bool released = false;
  };
  struct Mapping {
    std::size_t bytes = 0;
    std::uint64_t handle = 0;
    bool accessible = false;
  };
  using Mappings = std::pmr::map<std::uintptr_t, Mapping>;
  struct Reservation {
    std::size_t bytes = 0;
    Mappings mappings;  // by address; disjoint; nodes from nodes_
  };
  using Handles = std::unordered_map<std::uint64_t, Handle>;

  // The reservation holding [address, address + bytes), or throws LogicError naming `what`.
  Reservation& reservation_holding(std::uintptr_t address, std::size_t bytes, const char* what);
  const Reservation* find_reservation(std::uintptr_t address) const;
  // The mappings that exactly tile [address, address + bytes), or throws LogicError.
  std::pair<Mappings::iterator, Mappings::iterator> whole_mappings(Reservation& reservation,
                                                                   std::uintptr_t address,
                                                                   std::size_t bytes,
                                                                   const char* what);
  void check_granular(std::size_t value, const char* what) const;
  // Frees a handle's physical memory once it is released and unmapped everywhere.
  void free_if_unused(Handles::iterator handle);

  std::size_t granularity_;
  bool back_mappings_;
  HostPhysicalMemory physical_;
  // Mapping nodes are made and dropped once per page moved: a pool keeps that off the heap.
  std::pmr::unsynchronized_pool_resource nodes_;
  Handles handles_;
  std::uint64_t next_handle_ = 1;
  std::map<std::uintptr_t, Reservation> reservations_;  // by base address
  std::size_t mapping_count_ = 0;
};

}  // namespace stowage
