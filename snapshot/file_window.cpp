#include "snapshot/file_window.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

namespace {

[[noreturn]] void refuse_reading(int error) { SNAPSHOT_REFUSE("cannot read: ", std::strerror(error)); }

}  // namespace

std::unique_ptr<FileWindow> FileWindow::open(const std::string& path, std::size_t fill_ahead) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) refuse_reading(errno);
  Identity identity;
  try {
    identity = identity_of(fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  const auto size = static_cast<std::size_t>(identity.size);
  void* buffer = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (size == 0 || buffer == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<FileWindow>(
      new FileWindow(fd, static_cast<std::uint8_t*>(buffer), size, std::max<std::size_t>(fill_ahead, 1), identity));
}

FileWindow::FileWindow(int fd, std::uint8_t* buffer, std::size_t size, std::size_t fill_ahead, Identity identity)
    : fd_(fd), buffer_(buffer), size_(size), fill_ahead_(fill_ahead), identity_(identity) {}

FileWindow::~FileWindow() { close(); }

void FileWindow::close() {
  if (buffer_ != nullptr) ::munmap(buffer_, size_);
  if (fd_ >= 0) ::close(fd_);
  buffer_ = nullptr;
  fd_ = -1;
  size_ = filled_ = released_ = 0;
}

FileWindow::Identity FileWindow::identity_of(int fd) {
  struct stat status {};
  if (::fstat(fd, &status) != 0) refuse_reading(errno);
  return {status.st_size, std::int64_t{status.st_mtim.tv_sec} * 1'000'000'000 + status.st_mtim.tv_nsec,
          status.st_ino};
}

void FileWindow::unchanged() const {
  if (identity_of(fd_) != identity_) SNAPSHOT_REFUSE("the file changed while it was read");
}

std::size_t FileWindow::fill(std::size_t upto) {
  const std::size_t end = std::min(size_, std::max(upto, filled_ + fill_ahead_));
  while (filled_ < end) {
    const ssize_t count = ::pread(fd_, buffer_ + filled_, end - filled_, static_cast<off_t>(filled_));
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) refuse_reading(errno);
    if (count == 0) SNAPSHOT_REFUSE("the file changed while it was read");  // it shrank
    filled_ += static_cast<std::size_t>(count);
  }
  unchanged();
  return filled_;
}

void FileWindow::release(std::size_t upto) {
  // Private anonymous pages, once given back, read as zeros and cost nothing (the machine never
  // reads them again).
  upto = std::min(upto, filled_);
  if (upto <= released_) return;
  ::madvise(buffer_ + released_, upto - released_, MADV_DONTNEED);
  released_ = upto;
}

void FileWindow::rewind() {
  unchanged();
  filled_ = released_ = 0;
}

}  // namespace stowage::snapshot
