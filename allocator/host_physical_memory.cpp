#include "allocator/host_physical_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "allocator/errors.hpp"

namespace stowage {

namespace {

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

HostPhysicalMemory::HostPhysicalMemory(std::size_t capacity_bytes, std::size_t alignment)
    : alignment_(alignment),
      file_bytes_(round_up(capacity_bytes, alignment) * kFileSlack) {
  STOWAGE_CHECK(alignment > 0, "physical memory alignment must be positive");
  fd_ = ::memfd_create("stowage-device", MFD_CLOEXEC);
  if (fd_ < 0) {
    STOWAGE_THROW(BackendError, "memfd_create failed: ", std::strerror(errno));
  }
  if (file_bytes_ > 0 && ::ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0) {
    const int error = errno;
    ::close(fd_);
    STOWAGE_THROW(BackendError, "ftruncate of the device file to ", file_bytes_,
                  " bytes failed: ", std::strerror(error));
  }
  if (file_bytes_ > 0) free_ranges_.emplace(0, file_bytes_);
}

HostPhysicalMemory::~HostPhysicalMemory() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::size_t> HostPhysicalMemory::try_allocate(std::size_t bytes) {
  STOWAGE_CHECK(bytes > 0 && bytes % alignment_ == 0, "physical range of ", bytes,
                " bytes is not a positive multiple of ", alignment_);
  for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
    if (it->second < bytes) continue;
    const std::size_t offset = it->first;
    const std::size_t rest = it->second - bytes;
    free_ranges_.erase(it);
    if (rest > 0) free_ranges_.emplace(offset + bytes, rest);
    allocated_bytes_ += bytes;
    return offset;
  }
  return std::nullopt;
}

void HostPhysicalMemory::free(std::size_t offset, std::size_t bytes) {
  STOWAGE_INTERNAL_ASSERT(offset + bytes <= file_bytes_ && bytes <= allocated_bytes_);
  // Give the RAM back now: the range reads as zeros afterwards.
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(bytes)) != 0) {
    STOWAGE_THROW(BackendError, "punching a hole in the device file failed: ",
                  std::strerror(errno));
  }
  allocated_bytes_ -= bytes;
  auto next = free_ranges_.lower_bound(offset);
  STOWAGE_INTERNAL_ASSERT(next == free_ranges_.end() || next->first >= offset + bytes,
                          "range at offset ", offset, " overlaps a free range");
  std::size_t start = offset;
  std::size_t length = bytes;
  if (next != free_ranges_.begin()) {
    auto previous = std::prev(next);
    STOWAGE_INTERNAL_ASSERT(previous->first + previous->second <= offset,
                            "range at offset ", offset, " overlaps a free range");
    if (previous->first + previous->second == offset) {
      start = previous->first;
      length += previous->second;
      free_ranges_.erase(previous);
    }
  }
  if (next != free_ranges_.end() && next->first == offset + bytes) {
    length += next->second;
    free_ranges_.erase(next);
  }
  free_ranges_.emplace(start, length);
}

void HostPhysicalMemory::check_invariants() const {
  std::size_t free_bytes = 0;
  std::size_t previous_end = 0;
  bool first = true;
  for (const auto& [offset, bytes] : free_ranges_) {
    STOWAGE_INTERNAL_ASSERT(bytes > 0 && offset % alignment_ == 0 && bytes % alignment_ == 0);
    // Coalesced: a free range never touches the one before it.
    STOWAGE_INTERNAL_ASSERT(first || offset > previous_end, "free ranges not coalesced at ",
                            offset);
    previous_end = offset + bytes;
    free_bytes += bytes;
    first = false;
  }
  STOWAGE_INTERNAL_ASSERT(previous_end <= file_bytes_);
  STOWAGE_INTERNAL_ASSERT(free_bytes + allocated_bytes_ == file_bytes_,
                          "free ", free_bytes, " + allocated ", allocated_bytes_,
                          " != file size ", file_bytes_);
}

}  // namespace stowage
