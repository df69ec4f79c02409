#include "device/host/host_physical_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"

namespace stowage {

HostPhysicalMemory::HostPhysicalMemory(std::size_t capacity_bytes, std::size_t alignment,
                                       bool release_freed_memory)
    : ranges_(round_up(capacity_bytes, alignment) * kFileSlack, alignment),
      release_freed_memory_(release_freed_memory) {
  fd_ = ::memfd_create("stowage-device", MFD_CLOEXEC);
  if (fd_ < 0) {
    STOWAGE_THROW(BackendError, "memfd_create failed: ", std::strerror(errno));
  }
  if (ranges_.total() > 0 && ::ftruncate(fd_, static_cast<off_t>(ranges_.total())) != 0) {
    const int error = errno;
    ::close(fd_);
    STOWAGE_THROW(BackendError, "ftruncate of the device file to ", ranges_.total(),
                  " bytes failed: ", std::strerror(error));
  }
}

HostPhysicalMemory::~HostPhysicalMemory() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::size_t> HostPhysicalMemory::try_allocate(std::size_t bytes) {
  if (auto offset = ranges_.try_allocate(bytes)) return offset;
  // The offsets are fragmented: the file is sparse, so make it longer rather than fail.
  const std::size_t grown = ranges_.total() + std::max(bytes, ranges_.total());
  if (::ftruncate(fd_, static_cast<off_t>(grown)) != 0) return std::nullopt;
  ranges_.grow(grown);
  return ranges_.try_allocate(bytes);
}

void HostPhysicalMemory::free(std::size_t offset, std::size_t bytes) noexcept {
  // With release_freed_memory, give the RAM back now: the range reads as zeros afterwards. A
  // failed punch only delays that (the next user of the range overwrites it), so it is
  // reported, not thrown. Without it the RAM stays for the next handle, which then takes no
  // page faults (like a GPU, new physical memory holds whatever was there).
  if (release_freed_memory_ && ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(bytes)) != 0) {
    log_warning(detail::concat("punching a hole in the device file failed: ",
                               std::strerror(errno)));
  }
  ranges_.free(offset, bytes);
}

}  // namespace stowage
