// FileWindow: a large uncompressed snapshot file read as the machine goes (a ByteSource).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "snapshot/byte_source.hpp"

namespace stowage::snapshot {

// An anonymous private mapping of the file's size, filled `fill_ahead` bytes ahead of the reader
// and given back behind it (release), so that its pages cost memory only while they are read.
//
// Mapping the file itself costs the same, but a page read after the file had shrunk below it
// ends the process (SIGBUS), as when a snapshot is rewritten in place (torch's _dump_snapshot
// truncates, then writes) while it is read. Here such a read comes up short, and a file whose
// size, time or inode changed is refused. Contract: one reader at a time, not thread-safe; owns
// the file descriptor and the mapping; fill() and rewind() throw Refused ("the file changed while
// it was read", "cannot read: <the system's reason>").
class FileWindow final : public ByteSource {
 public:
  // The window over `path`; nullptr where the mapping cannot be made (no room for it: read the
  // file whole instead). Throws Refused where the file cannot be opened.
  static std::unique_ptr<FileWindow> open(const std::string& path, std::size_t fill_ahead);
  FileWindow(const FileWindow&) = delete;
  FileWindow& operator=(const FileWindow&) = delete;
  ~FileWindow() override;

  const std::uint8_t* data() const override { return buffer_; }
  std::size_t size() const override { return size_; }
  std::size_t fill(std::size_t upto) override;
  void release(std::size_t upto) override;
  // The window, to be read again from the start (its pages behind were given back).
  void rewind();
  // Gives back the mapping and the file now, not at destruction; the window is empty after.
  void close();

 private:
  struct Identity {
    off_t size = 0;
    std::int64_t modified_ns = 0;
    ino_t inode = 0;
    bool operator==(const Identity&) const = default;
  };
  FileWindow(int fd, std::uint8_t* buffer, std::size_t size, std::size_t fill_ahead, Identity identity);
  static Identity identity_of(int fd);  // the file's now
  void unchanged() const;

  int fd_;
  std::uint8_t* buffer_;
  std::size_t size_, fill_ahead_;
  Identity identity_;         // the file's when opened
  std::size_t filled_ = 0;    // bytes read into the buffer, from the start
  std::size_t released_ = 0;  // bytes given back, from the start
};

}  // namespace stowage::snapshot
