#include "allocator/segment_source.hpp"

#include <exception>

#include "base/log.hpp"
#include "base/numbers.hpp"
#include "device_call_timer.hpp"

namespace stowage {

SegmentSource::SegmentSource(const SourceParts& parts)
    : memory_(parts.segments),
      cache_(parts.cache),
      stats_(parts.stats),
      trace_(parts.trace),
      limit_(parts.limit),
      budget_(parts.budget),
      shared_(parts.shared),
      max_split_size_(parts.max_split_size) {}

Block* SegmentSource::grow_again(const GrowRequest& request) {
  // Asked again even when nothing was released: the device's failure may have been transient,
  // and memory freed elsewhere on the device may have come back.
  release_cached();
  return allocate(shared_, request);
}

bool SegmentSource::release_cached() {
  return release_free([this](const Segment& segment) { return segment.pool == &shared_; });
}

Block* SegmentSource::allocate(Pool& pool, const GrowRequest& request) {
  // The preferred size first (a medium request's shared segment); when the device or the limit
  // refuses it, the smallest segment that holds the block.
  const auto [preferred, smallest] = memory_.sizes_for(request.rounded);
  if (&pool == &shared_ && !request.capturing) make_room(preferred, request.rounded);
  auto try_size = [&](std::size_t size) -> void* {
    const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
    if (!limit_.allows(reserved, size)) return nullptr;
    return timed_call(stats_, [&] { return memory_.try_allocate(size); });
  };
  std::size_t size = preferred;
  void* base = try_size(size);
  if (base == nullptr && smallest < preferred) base = try_size(size = smallest);
  if (base == nullptr) return nullptr;
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  Block* block = nullptr;
  try {
    block = cache_.add_segment(address, size, request.stream, request.size_class,
                               request.context, pool);
  } catch (...) {
    timed_call(stats_, [&] { memory_.free(base); });
    throw;
  }
  ++stats_.num_device_alloc;
  stats_.segment.update(request.size_class, 1);
  stats_.reserved_bytes.update(request.size_class, as_signed(size));
  if (size >= max_split_size_) stats_.oversize_segments.update(1);
  trace_.record(TraceAction::kSegmentAlloc, address, size, request.stream, request.context);
  return block;
}

void SegmentSource::make_room(std::size_t size, std::size_t rounded) {
  if (budget_.unbounded()) return;  // grow whenever the device has room
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  if (budget_.allows(reserved + size, rounded)) return;
  // Cached segments no request has fitted go back before a new one comes, so reserved stays
  // near the peak in use.
  cache_.synchronize_pending();
  release_cached();
  budget_.note_churn(reserved - static_cast<std::size_t>(stats_.reserved_bytes.all().current));
}

bool SegmentSource::release_free(const std::function<bool(const Segment&)>& which) {
  bool released = false;
  auto& segments = cache_.segments();
  for (auto it = segments.begin(); it != segments.end();) {
    Segment& segment = (it++)->second;  // advanced first: releasing erases the segment
    if (segment.pages != nullptr || !segment.is_free() || !which(segment)) continue;
    Block* block = segment.first;
    cache_.unindex(*block);
    try {
      release(segment);
    } catch (const std::exception& error) {
      cache_.index(*block);
      log_warning(detail::concat("returning a segment to the device failed: ", error.what()));
      continue;
    }
    released = true;
  }
  return released;
}

void SegmentSource::release(Segment& segment) {
  timed_call(stats_, [&] { memory_.free(reinterpret_cast<void*>(segment.base)); });
  ++stats_.num_device_free;
  stats_.segment.update(segment.size_class, -1);
  stats_.reserved_bytes.update(segment.size_class, -as_signed(segment.size));
  if (segment.size >= max_split_size_) stats_.oversize_segments.update(-1);
  trace_.record(TraceAction::kSegmentFree, segment.base, segment.size, segment.stream, 0);
  cache_.remove_segment(segment);
}

}  // namespace stowage
