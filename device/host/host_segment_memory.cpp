#include "device/host/host_segment_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "device/host/host_pages.hpp"

namespace stowage {

HostSegmentMemory::HostSegmentMemory(std::size_t capacity_bytes, bool release_freed_memory)
    : page_(host_page_size()),
      release_freed_memory_(release_freed_memory),
      ranges_(round_up(capacity_bytes, host_page_size()) * kRegionSlack, host_page_size()) {
  void* region = ::mmap(nullptr, ranges_.total(), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) {
    STOWAGE_THROW(BackendError, "reserving ", ranges_.total(),
                  " bytes of address space for the simulated device failed: ",
                  std::strerror(errno));
  }
  base_ = reinterpret_cast<std::uintptr_t>(region);
  // Huge pages where the kernel offers them: one fault and one TLB entry per 2 MiB instead of
  // 512. Advice only; without it everything still works.
  ::madvise(region, ranges_.total(), MADV_HUGEPAGE);
}

HostSegmentMemory::~HostSegmentMemory() {
  ::munmap(reinterpret_cast<void*>(base_), ranges_.total());
  for (const auto& [base, length] : overflow_) ::munmap(reinterpret_cast<void*>(base), length);
}

void* HostSegmentMemory::try_allocate(std::size_t bytes) {
  const std::size_t length = round_up(bytes, page_);
  if (const auto offset = ranges_.try_allocate(length)) {
    return reinterpret_cast<void*>(base_ + *offset);
  }
  void* ptr = ::mmap(nullptr, length, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (ptr == MAP_FAILED) return nullptr;
  overflow_.emplace(reinterpret_cast<std::uintptr_t>(ptr), length);
  return ptr;
}

void HostSegmentMemory::free(void* ptr, std::size_t bytes) {
  const std::size_t length = round_up(bytes, page_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  if (const auto it = overflow_.find(address); it != overflow_.end()) {
    ::munmap(ptr, it->second);
    overflow_.erase(it);
    return;
  }
  if (release_freed_memory_) ::madvise(ptr, length, MADV_DONTNEED);
  ranges_.free(address - base_, length);
}

}  // namespace stowage
