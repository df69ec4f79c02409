#include "device/host/host_virtual_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>

#include "base/errors.hpp"
#include "device/host/host_pages.hpp"

namespace stowage {

namespace {

void* to_pointer(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

// Puts a fresh PROT_NONE reservation over [address, address + bytes), dropping whatever was
// mapped there.
void restore_reservation(std::uintptr_t address, std::size_t bytes) {
  void* result = ::mmap(to_pointer(address), bytes, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (result == MAP_FAILED) {
    STOWAGE_THROW(BackendError, "restoring reserved address space at 0x", std::hex, address,
                  std::dec, " failed: ", std::strerror(errno));
  }
}

}  // namespace

HostVirtualMemory::HostVirtualMemory(std::size_t capacity_bytes, std::size_t granularity,
                                     bool release_freed_memory, bool back_mappings)
    : granularity_(granularity),
      back_mappings_(back_mappings),
      physical_(capacity_bytes, granularity, release_freed_memory) {
  const std::size_t page = host_page_size();
  STOWAGE_CHECK(granularity > 0 && granularity % page == 0, "granularity ", granularity,
                " is not a positive multiple of the host page size ", page);
}

HostVirtualMemory::~HostVirtualMemory() {
  // Unmapping a reservation drops the views inside it too.
  for (const auto& [base, reservation] : reservations_) {
    ::munmap(to_pointer(base), reservation.bytes);
  }
}

void HostVirtualMemory::check_granular(std::size_t value, const char* what) const {
  STOWAGE_CHECK(value % granularity_ == 0, what, " ", value,
                " is not a multiple of the granularity ", granularity_);
}

void* HostVirtualMemory::reserve(std::size_t bytes, std::size_t alignment) {
  STOWAGE_CHECK(bytes > 0, "cannot reserve an empty address range");
  STOWAGE_CHECK(bytes <= kMaxReservation && alignment <= kMaxReservation, "cannot reserve ",
                bytes, " bytes aligned to ", alignment, ": more than the ", kMaxReservation,
                " bytes of address space a process can have");
  check_granular(bytes, "reservation size");
  if (alignment < granularity_) alignment = granularity_;
  STOWAGE_CHECK(std::has_single_bit(alignment), "reservation alignment ", alignment,
                " is not a power of two");
  // Over-reserve, then trim both ends so the base is aligned.
  const std::size_t span = bytes + alignment;
  void* raw = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    STOWAGE_THROW(BackendError, "reserving ", bytes, " bytes of address space failed: ",
                  std::strerror(errno));
  }
  const std::uintptr_t start = to_address(raw);
  const std::uintptr_t base = (start + alignment - 1) & ~(alignment - 1);
  if (base > start) ::munmap(raw, base - start);
  const std::uintptr_t end = base + bytes;
  if (start + span > end) ::munmap(to_pointer(end), start + span - end);
  reservations_.emplace(base, Reservation{bytes, Mappings(&nodes_)});
  return to_pointer(base);
}

void HostVirtualMemory::release_reservation(void* base, std::size_t bytes) {
  const auto it = reservations_.find(to_address(base));
  STOWAGE_CHECK(it != reservations_.end(), "release of address range ", base,
                ", which is not the start of a reservation");
  STOWAGE_CHECK(it->second.bytes == bytes, "release of ", bytes, " bytes at ", base,
                ", but the reservation there is ", it->second.bytes,
                " bytes: reservations are released whole");
  STOWAGE_CHECK(it->second.mappings.empty(), "release of the reservation at ", base,
                " while ", it->second.mappings.size(), " mapping(s) remain in it: unmap first");
  if (::munmap(base, bytes) != 0) {
    STOWAGE_THROW(BackendError, "munmap of a reservation failed: ", std::strerror(errno));
  }
  reservations_.erase(it);
}

std::optional<PhysicalHandle> HostVirtualMemory::try_create(std::size_t bytes) {
  STOWAGE_CHECK(bytes > 0, "cannot create an empty physical allocation");
  check_granular(bytes, "physical allocation size");
  const auto offset = physical_.try_allocate(bytes);
  if (!offset) return std::nullopt;
  const std::uint64_t id = next_handle_++;
  handles_.emplace(id, Handle{*offset, bytes, 0, false});
  return PhysicalHandle{id};
}

void HostVirtualMemory::free_if_unused(Handles::iterator handle) {
  if (!handle->second.released || handle->second.mappings > 0) return;
  physical_.free(handle->second.file_offset, handle->second.bytes);
  handles_.erase(handle);
}

void HostVirtualMemory::release(PhysicalHandle handle) {
  const auto it = handles_.find(handle.value);
  STOWAGE_CHECK(it != handles_.end() && !it->second.released, "release of physical handle ",
                handle.value, ", which is not a live handle (never created, or released already)");
  it->second.released = true;
  free_if_unused(it);
}

const HostVirtualMemory::Reservation* HostVirtualMemory::find_reservation(
    std::uintptr_t address) const {
  auto it = reservations_.upper_bound(address);
  if (it == reservations_.begin()) return nullptr;
  --it;
  if (address >= it->first + it->second.bytes) return nullptr;
  return &it->second;
}

HostVirtualMemory::Reservation& HostVirtualMemory::reservation_holding(std::uintptr_t address,
                                                                       std::size_t bytes,
                                                                       const char* what) {
  auto it = reservations_.upper_bound(address);
  STOWAGE_CHECK(it != reservations_.begin(), what, " at 0x", std::hex, address, std::dec,
                " is outside every reserved address range");
  --it;
  STOWAGE_CHECK(bytes <= it->first + it->second.bytes - address, what, " of ", bytes,
                " bytes at 0x", std::hex, address, std::dec,
                " does not lie inside one reserved address range");
  return it->second;
}

bool HostVirtualMemory::reserved(const void* address) const {
  return find_reservation(to_address(address)) != nullptr;
}

void HostVirtualMemory::map(void* address, std::size_t bytes, PhysicalHandle handle,
                            std::size_t handle_offset) {
  const std::uintptr_t start = to_address(address);
  const auto handle_it = handles_.find(handle.value);
  STOWAGE_CHECK(handle_it != handles_.end() && !handle_it->second.released, "map of physical handle ",
                handle.value, ", which is not a live handle");
  STOWAGE_CHECK(handle_offset == 0, "map at offset ", handle_offset,
                " into a physical handle: handles are mapped from offset 0");
  STOWAGE_CHECK(bytes == handle_it->second.bytes, "map of ", bytes, " bytes of a handle of ",
                handle_it->second.bytes, " bytes: a handle is mapped whole");
  check_granular(start, "map address");
  Reservation& reservation = reservation_holding(start, bytes, "map");
  // The new mapping must not overlap the mapping before it or the one after it.
  auto next = reservation.mappings.lower_bound(start);
  STOWAGE_CHECK(next == reservation.mappings.end() || next->first >= start + bytes,
                "map at 0x", std::hex, start, std::dec, " overlaps an existing mapping");
  if (next != reservation.mappings.begin()) {
    const auto previous = std::prev(next);
    STOWAGE_CHECK(previous->first + previous->second.bytes <= start, "map at 0x", std::hex, start,
                  std::dec, " overlaps an existing mapping");
  }
  if (back_mappings_) {
    void* result = ::mmap(address, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, physical_.fd(),
                          static_cast<off_t>(handle_it->second.file_offset));
    if (result == MAP_FAILED) {
      STOWAGE_THROW(BackendError, "mapping a physical handle failed: ", std::strerror(errno));
    }
  }
  reservation.mappings.emplace(start, Mapping{bytes, handle.value, false});
  ++handle_it->second.mappings;
  ++mapping_count_;
}

std::pair<HostVirtualMemory::Mappings::iterator, HostVirtualMemory::Mappings::iterator>
HostVirtualMemory::whole_mappings(Reservation& reservation, std::uintptr_t address,
                                  std::size_t bytes, const char* what) {
  STOWAGE_CHECK(bytes > 0, what, " of an empty range");
  const auto first = reservation.mappings.find(address);
  STOWAGE_CHECK(first != reservation.mappings.end(), what, " at 0x", std::hex, address, std::dec,
                " does not start at a mapping: ", what, " covers whole mappings only");
  auto it = first;
  std::uintptr_t covered = address;
  const std::uintptr_t end = address + bytes;
  while (covered < end) {
    STOWAGE_CHECK(it != reservation.mappings.end() && it->first == covered, what, " of ", bytes,
                  " bytes at 0x", std::hex, address, " reaches unmapped space at 0x", covered,
                  std::dec);
    covered += it->second.bytes;
    ++it;
  }
  STOWAGE_CHECK(covered == end, what, " of ", bytes, " bytes at 0x", std::hex, address, std::dec,
                " ends inside a mapping: ", what, " covers whole mappings only");
  return {first, it};
}

void HostVirtualMemory::set_access(void* address, std::size_t bytes) {
  const std::uintptr_t start = to_address(address);
  Reservation& reservation = reservation_holding(start, bytes, "set_access");
  const auto [first, last] = whole_mappings(reservation, start, bytes, "set_access");
  if (back_mappings_ && ::mprotect(address, bytes, PROT_READ | PROT_WRITE) != 0) {
    STOWAGE_THROW(BackendError, "mprotect failed: ", std::strerror(errno));
  }
  for (auto it = first; it != last; ++it) it->second.accessible = true;
}

void HostVirtualMemory::unmap(void* address, std::size_t bytes) {
  const std::uintptr_t start = to_address(address);
  Reservation& reservation = reservation_holding(start, bytes, "unmap");
  const auto [first, last] = whole_mappings(reservation, start, bytes, "unmap");
  if (back_mappings_) restore_reservation(start, bytes);
  for (auto it = first; it != last; ++it) {
    const auto handle = handles_.find(it->second.handle);
    STOWAGE_INTERNAL_ASSERT(handle != handles_.end() && handle->second.mappings > 0);
    --handle->second.mappings;
    --mapping_count_;
    free_if_unused(handle);
  }
  reservation.mappings.erase(first, last);
}

void HostVirtualMemory::check_accessible(const void* address, std::size_t bytes) const {
  const std::uintptr_t start = to_address(address);
  const Reservation* reservation = find_reservation(start);
  STOWAGE_CHECK(reservation != nullptr, "0x", std::hex, start, std::dec,
                " is not in a reserved range");
  STOWAGE_CHECK(bytes <= std::numeric_limits<std::uintptr_t>::max() - start, bytes,
                " bytes at 0x", std::hex, start, std::dec, " run past the end of memory");
  const std::uintptr_t end = start + bytes;
  auto it = reservation->mappings.upper_bound(start);
  STOWAGE_CHECK(it != reservation->mappings.begin(), "device memory at 0x", std::hex, start,
                std::dec, " is not mapped");
  --it;
  std::uintptr_t covered = start;
  while (covered < end) {
    STOWAGE_CHECK(it != reservation->mappings.end() && it->first <= covered &&
                      covered < it->first + it->second.bytes,
                  "device memory at 0x", std::hex, covered, std::dec, " is not mapped");
    STOWAGE_CHECK(it->second.accessible, "device memory at 0x", std::hex, covered, std::dec,
                  " is mapped but its access was never set (set_access)");
    covered = it->first + it->second.bytes;
    ++it;
  }
}

void HostVirtualMemory::check_invariants() const {
  physical_.check_invariants();
  std::map<std::uint64_t, std::size_t> mappings_per_handle;
  std::size_t mappings = 0;
  for (const auto& [base, reservation] : reservations_) {
    STOWAGE_INTERNAL_ASSERT(base % granularity_ == 0 && reservation.bytes % granularity_ == 0);
    std::uintptr_t previous_end = base;
    for (const auto& [address, mapping] : reservation.mappings) {
      STOWAGE_INTERNAL_ASSERT(address >= previous_end, "mappings overlap at ", address);
      STOWAGE_INTERNAL_ASSERT(address + mapping.bytes <= base + reservation.bytes,
                              "mapping outside its reservation at ", address);
      const auto handle = handles_.find(mapping.handle);
      STOWAGE_INTERNAL_ASSERT(handle != handles_.end(), "mapping of a freed handle at ", address);
      STOWAGE_INTERNAL_ASSERT(handle->second.bytes == mapping.bytes);
      ++mappings_per_handle[mapping.handle];
      ++mappings;
      previous_end = address + mapping.bytes;
    }
  }
  STOWAGE_INTERNAL_ASSERT(mappings == mapping_count_);
  std::size_t held = 0;
  for (const auto& [id, handle] : handles_) {
    const auto counted = mappings_per_handle.find(id);
    STOWAGE_INTERNAL_ASSERT(
        handle.mappings == (counted == mappings_per_handle.end() ? 0 : counted->second),
        "handle ", id, " mapping count is wrong");
    STOWAGE_INTERNAL_ASSERT(!handle.released || handle.mappings > 0,
                            "released, unmapped handle ", id, " still holds memory");
    held += handle.bytes;
  }
  STOWAGE_INTERNAL_ASSERT(held == physical_.allocated_bytes(), "handles hold ", held,
                          " bytes but the device file has ", physical_.allocated_bytes());
}

}  // namespace stowage
