#include "allocator/paged_memory.hpp"

#include <algorithm>
#include <exception>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"
#include "device_call_timer.hpp"

namespace stowage {

namespace {

void* address(std::uintptr_t value) { return reinterpret_cast<void*>(value); }

}  // namespace

PagedMemory::PagedMemory(DeviceBackend& backend, BlockCache& cache, DeviceStats& stats,
                         TraceRecorder& trace)
    : backend_(backend),
      cache_(cache),
      stats_(stats),
      trace_(trace),
      page_(backend.properties().granularity) {
  STOWAGE_CHECK(backend.properties().virtual_memory && page_ > 0, backend.properties().name,
                " has no virtual memory management");
}

// --- reservations ---

Block* PagedMemory::reserve(Pool& pool, SizeClass size_class, Stream stream, std::size_t bytes,
                            std::uint64_t context) {
  void* base = nullptr;
  try {
    base = timed_call(stats_, [&] { return backend_.reserve_address_range(bytes, page_); });
  } catch (const std::exception& error) {
    log_warning(detail::concat("reserving ", format_bytes(bytes),
                               " of device address space failed: ", error.what()));
    return nullptr;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  Block* hole = nullptr;
  try {
    PageTable& table = tables_[start];
    table.page_bytes = page_;
    hole = cache_.add_segment(start, bytes, stream, size_class, context, pool, &table);
    if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end()) {
      streams_.push_back(stream);
    }
  } catch (...) {
    if (hole != nullptr) cache_.remove_segment(*hole->segment);
    tables_.erase(start);
    timed_call(stats_, [&] { backend_.release_address_range(base, bytes); });
    throw;
  }
  cache_.index(*hole);
  stats_.segment.update(size_class, 1);
  return hole;
}

bool PagedMemory::release_empty_reservations(const Pool& pool) {
  bool released = false;
  auto& segments = cache_.segments();
  for (auto it = segments.begin(); it != segments.end();) {
    Segment& segment = (it++)->second;  // advanced first: releasing erases the segment
    Block* hole = segment.first;
    if (segment.pages == nullptr || segment.pool != &pool || segment.pages->mapped != 0 ||
        hole->next != nullptr || overlaps_lost_range(*hole)) {
      continue;
    }
    cache_.unindex(*hole);
    try {
      timed_call(stats_, [&] {
        backend_.release_address_range(address(segment.base), segment.size);
      });
    } catch (const std::exception& error) {
      cache_.index(*hole);
      log_warning(detail::concat("releasing device address space failed: ", error.what()));
      continue;
    }
    stats_.segment.update(segment.size_class, -1);
    tables_.erase(segment.base);
    cache_.remove_segment(segment);
    released = true;
  }
  return released;
}

// --- pages ---

bool PagedMemory::create_page(std::vector<PhysicalHandle>& out) {
  std::optional<PhysicalHandle> handle;
  try {
    handle = timed_call(stats_, [&] { return backend_.try_create_physical(page_); });
  } catch (const std::exception& error) {
    log_warning(detail::concat("creating a page of device memory failed: ", error.what()));
    return false;
  }
  if (!handle) return false;
  out.push_back(*handle);
  ++stats_.num_device_alloc;
  return true;
}

void PagedMemory::release_pages(std::vector<PhysicalHandle>& handles) {
  for (const PhysicalHandle handle : handles) {
    try {
      timed_call(stats_, [&] { backend_.release_physical(handle); });
      ++stats_.num_device_free;
    } catch (const std::exception& error) {
      log_warning(detail::concat("releasing a page of device memory failed: ", error.what()));
    }
  }
  handles.clear();
}

bool PagedMemory::map(std::uintptr_t start, std::vector<PhysicalHandle>& handles) {
  std::size_t mapped = 0;
  try {
    for (; mapped < handles.size(); ++mapped) {
      timed_call(stats_, [&] {
        backend_.map(address(start + mapped * page_), page_, handles[mapped]);
      });
    }
    timed_call(stats_, [&] { backend_.set_access(address(start), handles.size() * page_); });
    return true;
  } catch (const std::exception& error) {
    log_warning(detail::concat("mapping ", format_bytes(handles.size() * page_),
                               " of device memory failed: ", error.what()));
  }
  // Undo the maps that succeeded, trying again on a transient failure. If the device keeps
  // refusing, keep the mapped pages as cache rather than lose track of them.
  for (int attempt = 0; mapped > 0 && attempt < 3; ++attempt) {
    try {
      timed_call(stats_, [&] { backend_.unmap(address(start), mapped * page_); });
      mapped = 0;
    } catch (const std::exception&) {
    }
  }
  if (mapped > 0) {
    try {
      timed_call(stats_, [&] { backend_.set_access(address(start), mapped * page_); });
    } catch (const std::exception& error) {
      log_warning(detail::concat("device memory at ", address(start),
                                 " can be neither unmapped nor made accessible (", error.what(),
                                 "); ", mapped, " page(s) are set aside until they unmap"));
      // The handles are released below (their memory returns once unmapped); the range stays
      // out of use, and every release tries to unmap it again.
      lost_ranges_.emplace_back(start, mapped * page_);
      mapped = 0;
    }
  }
  std::vector<PhysicalHandle> unused(handles.begin() + static_cast<std::ptrdiff_t>(mapped),
                                     handles.end());
  release_pages(unused);
  handles.resize(mapped);
  return false;
}

Block* PagedMemory::adopt(Block* hole, const std::vector<PhysicalHandle>& handles,
                          std::uint64_t context) {
  Segment& segment = *hole->segment;
  PageTable& table = *segment.pages;
  const std::uintptr_t start = hole->address;
  const std::size_t pages = handles.size();
  const std::size_t bytes = pages * page_;
  Block* rest = hole->size > bytes ? cache_.acquire_block() : nullptr;
  const std::size_t first_page = (start - segment.base) / page_;
  if (table.handles.size() < first_page + pages) table.handles.resize(first_page + pages, 0);
  for (std::size_t i = 0; i < pages; ++i) table.handles[first_page + i] = handles[i].value;
  table.mapped += pages;
  stats_.reserved_bytes.update(segment.size_class, as_signed(bytes));
  stats_.mapped_pages.update(as_signed(pages));
  stats_.num_maps += as_signed(pages);
  trace_.record(TraceAction::kSegmentMap, start, bytes, hole->stream, context);

  // The mapped part of the hole becomes cache, joined to the free mapped block before it.
  cache_.unindex(*hole);
  if (rest != nullptr) {
    BlockCache::split_after(hole, bytes, rest);  // rest stays unmapped, like the hole
    cache_.index(*rest);
  }
  hole->mapped = true;
  return cache_.insert_free(hole);
}

bool PagedMemory::unmap(Block* block, std::uintptr_t first, std::uintptr_t last,
                        std::vector<PhysicalHandle>& out) {
  Segment& segment = *block->segment;
  const bool has_head = first > block->address;
  const bool has_tail = last < block->address + block->size;
  // Take the bookkeeping first, so that nothing can fail after the device has unmapped.
  Block* head = has_head ? cache_.acquire_block() : nullptr;
  Block* tail = nullptr;
  try {
    if (has_tail) tail = cache_.acquire_block();
    out.reserve(out.size() + (last - first) / page_);
    timed_call(stats_, [&] { backend_.unmap(address(first), last - first); });
  } catch (const std::exception& error) {
    if (head != nullptr) cache_.recycle_block(head);
    if (tail != nullptr) cache_.recycle_block(tail);
    log_warning(detail::concat("unmapping ", format_bytes(last - first),
                               " of device memory failed: ", error.what()));
    return false;
  }
  const std::size_t pages = (last - first) / page_;
  for (std::size_t page = (first - segment.base) / page_, end = page + pages; page < end; ++page) {
    out.push_back(PhysicalHandle{segment.pages->handles[page]});
    segment.pages->handles[page] = 0;
  }
  segment.pages->mapped -= pages;
  stats_.reserved_bytes.update(segment.size_class, -as_signed(last - first));
  stats_.mapped_pages.update(-as_signed(pages));
  stats_.num_unmaps += as_signed(pages);
  trace_.record(TraceAction::kSegmentUnmap, first, last - first, block->stream, 0);

  // Cut the block into [head][hole][tail]; the head and tail stay cached.
  cache_.unindex(*block);
  if (tail != nullptr) BlockCache::split_after(block, last - block->address, tail);
  Block* hole = block;
  if (head != nullptr) {
    // block keeps the head; head (the spare) becomes the hole.
    hole = head;
    BlockCache::split_after(block, first - block->address, hole);
    cache_.index(*block);
  }
  hole->mapped = false;
  if (tail != nullptr) cache_.index(*tail);
  cache_.insert_free(hole);
  return true;
}

// --- ranges set aside ---

bool PagedMemory::overlaps_lost_range(const Block& hole) const noexcept {
  for (const auto& [start, bytes] : lost_ranges_) {
    if (start < hole.address + hole.size && hole.address < start + bytes) return true;
  }
  return false;
}

std::size_t PagedMemory::pages_before_lost_range(const Block& hole) const noexcept {
  std::size_t pages = hole.size / page_;
  for (const auto& [start, bytes] : lost_ranges_) {
    if (start >= hole.address && start < hole.address + hole.size) {
      pages = std::min(pages, (start - hole.address) / page_);
    }
  }
  return pages;
}

void PagedMemory::retry_lost_ranges() {
  std::erase_if(lost_ranges_, [&](const std::pair<std::uintptr_t, std::size_t>& range) {
    try {
      timed_call(stats_, [&] { backend_.unmap(address(range.first), range.second); });
      return true;
    } catch (const std::exception&) {
      return false;
    }
  });
}

}  // namespace stowage
