#include "device/host/range_allocator.hpp"

#include <iterator>

#include "base/errors.hpp"

namespace stowage {

RangeAllocator::RangeAllocator(std::size_t total, std::size_t alignment)
    : total_(total), alignment_(alignment) {
  STOWAGE_CHECK(alignment > 0 && total % alignment == 0, "range of ", total,
                " bytes is not a multiple of the alignment ", alignment);
  if (total > 0) free_ranges_.emplace(0, total);
}

std::optional<std::size_t> RangeAllocator::try_allocate(std::size_t bytes) {
  STOWAGE_CHECK(bytes > 0 && bytes % alignment_ == 0, "range of ", bytes,
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

void RangeAllocator::free(std::size_t offset, std::size_t bytes) {
  STOWAGE_INTERNAL_ASSERT(offset + bytes <= total_ && bytes <= allocated_bytes_);
  auto next = free_ranges_.lower_bound(offset);
  STOWAGE_INTERNAL_ASSERT(next == free_ranges_.end() || next->first >= offset + bytes,
                          "range at offset ", offset, " overlaps a free range");
  std::size_t start = offset;
  std::size_t length = bytes;
  if (next != free_ranges_.begin()) {
    auto previous = std::prev(next);
    STOWAGE_INTERNAL_ASSERT(previous->first + previous->second <= offset, "range at offset ",
                            offset, " overlaps a free range");
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
  allocated_bytes_ -= bytes;
}

void RangeAllocator::grow(std::size_t new_total) {
  STOWAGE_CHECK(new_total > total_ && new_total % alignment_ == 0, "cannot grow a range of ",
                total_, " bytes to ", new_total);
  const std::size_t old_total = total_;
  total_ = new_total;
  allocated_bytes_ += new_total - old_total;  // free() below takes the tail back out
  free(old_total, new_total - old_total);
}

void RangeAllocator::check_invariants() const {
  std::size_t free_bytes = 0;
  std::size_t previous_end = 0;
  bool first = true;
  for (const auto& [offset, bytes] : free_ranges_) {
    STOWAGE_INTERNAL_ASSERT(bytes > 0 && offset % alignment_ == 0 && bytes % alignment_ == 0);
    STOWAGE_INTERNAL_ASSERT(first || offset > previous_end, "free ranges not coalesced at ",
                            offset);
    previous_end = offset + bytes;
    free_bytes += bytes;
    first = false;
  }
  STOWAGE_INTERNAL_ASSERT(previous_end <= total_);
  STOWAGE_INTERNAL_ASSERT(free_bytes + allocated_bytes_ == total_, "free ", free_bytes,
                          " + allocated ", allocated_bytes_, " != total ", total_);
}

}  // namespace stowage
