// PodColumn: a growing array of plain values: a trace's column (snapshot/trace_columns.hpp), the
// machine's stack (snapshot/machine.hpp).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>

namespace stowage::snapshot {

// A growing array of plain values in one malloc'd block. It grows by a quarter at a time through
// realloc, which moves a large block by remapping its pages rather than copying them, so that
// its memory is at most a quarter over its size and never twice it while it grows (as a vector's
// is, for a moment, each time it doubles); release() gives the block away (numpy takes it
// without a copy). Not thread-safe.
template <typename T>
class PodColumn {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  PodColumn() = default;
  PodColumn(const PodColumn&) = delete;
  PodColumn& operator=(const PodColumn&) = delete;
  PodColumn(PodColumn&& other) noexcept
      : data_(other.data_), size_(other.size_), capacity_(other.capacity_) {
    other.data_ = nullptr;
    other.size_ = other.capacity_ = 0;
  }
  ~PodColumn() { std::free(data_); }

  void push_back(T value) {
    if (size_ == capacity_) grow();
    data_[size_++] = value;
  }
  void pop_back() { --size_; }
  void resize(std::size_t smaller) { size_ = smaller; }  // never larger
  void clear() { size_ = 0; }
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  const T* data() const { return data_; }
  T* data() { return data_; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }
  T& operator[](std::size_t index) { return data_[index]; }
  const T& operator[](std::size_t index) const { return data_[index]; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

  // The block (size() values; nullptr when empty), which the caller now frees with std::free.
  T* release() {
    T* block = data_;
    if (block != nullptr && size_ < capacity_) {
      void* shrunk = std::realloc(block, size_ * sizeof(T));
      if (shrunk != nullptr) block = static_cast<T*>(shrunk);
    }
    data_ = nullptr;
    size_ = capacity_ = 0;
    return block;
  }

 private:
  void grow() {
    constexpr std::size_t kFirst = 16384;
    const std::size_t more = capacity_ / 4 > kFirst ? capacity_ / 4 : kFirst;
    void* grown = std::realloc(data_, (capacity_ + more) * sizeof(T));
    if (grown == nullptr) throw std::bad_alloc();
    data_ = static_cast<T*>(grown);
    capacity_ += more;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace stowage::snapshot
