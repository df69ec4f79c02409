// ByteSource: the pickle's bytes as the machine (snapshot/machine.hpp) reads them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stowage::snapshot {

// The bytes of one pickle, from the start. data() stays valid for the whole reading, but only
// the bytes fill() has made readable may be read; a large file is read into them as the machine
// goes and its pages given back behind it (snapshot/file_window.hpp). fill()
// and release() may throw (a file that changes while it is read), which ends the reading.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual const std::uint8_t* data() const = 0;
  virtual std::size_t size() const = 0;
  // Makes the bytes [0, upto) readable (upto <= size()), and as many more as it likes; returns
  // how many bytes from the start are readable now.
  virtual std::size_t fill(std::size_t upto) = 0;
  // The bytes before `upto` will not be read again.
  virtual void release(std::size_t upto) = 0;
};

// Bytes already in memory, all readable.
class MemoryBytes final : public ByteSource {
 public:
  MemoryBytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  const std::uint8_t* data() const override { return data_; }
  std::size_t size() const override { return size_; }
  std::size_t fill(std::size_t /*upto*/) override { return size_; }
  void release(std::size_t /*upto*/) override {}

 private:
  const std::uint8_t* data_;
  std::size_t size_;
};

}  // namespace stowage::snapshot
