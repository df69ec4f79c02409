#include "snapshot/trace_columns.hpp"

#include <algorithm>

namespace stowage::snapshot {

namespace {

std::uint64_t hash_of(std::span<const Handle> frames) {
  std::uint64_t hash = 0xcbf29ce484222325ULL ^ frames.size();
  for (const Handle frame : frames) {
    hash ^= reinterpret_cast<std::uintptr_t>(frame);
    hash *= 0x100000001b3ULL;
    hash ^= hash >> 29;
  }
  return hash;
}

}  // namespace

std::int32_t StackTable::index_of(std::span<const Handle> frames, Objects& objects) {
  if (frames.empty()) return kNoStack;
  const std::uint64_t hash = hash_of(frames);
  const auto [first, last] = by_hash_.equal_range(hash);
  for (auto it = first; it != last; ++it) {
    const std::vector<Handle>& stored = stacks_[static_cast<std::size_t>(it->second)];
    if (std::equal(stored.begin(), stored.end(), frames.begin(), frames.end())) return it->second;
  }
  const auto index = static_cast<std::int32_t>(stacks_.size());
  stacks_.emplace_back(frames.begin(), frames.end());
  frames_ += frames.size();
  for (const Handle frame : frames) objects.retain(frame);
  by_hash_.emplace(hash, index);
  return index;
}

void StackTable::clear(Objects& objects) {
  for (const std::vector<Handle>& stored : stacks_) {
    for (const Handle frame : stored) objects.release(frame);
  }
  stacks_.clear();
  by_hash_.clear();
  frames_ = 0;
}

void TraceColumnsBuilder::add(const Row& row, Objects& objects) {
  const std::uint64_t index = count_++;
  if (error_) return;
  action.push_back(row.action);
  flags.push_back(row.flags);
  addr.push_back(row.addr);
  size.push_back(row.size);
  stream.push_back(row.stream);
  time.push_back(row.time);
  stack.push_back(row.stack);
  if ((row.flags & kHasDeviceFree) != 0) device_free.emplace_back(index, row.device_free);
  if (row.has_metadata) {
    objects.retain(row.metadata);
    metadata.emplace_back(index, row.metadata);
  }
}

void TraceColumnsBuilder::fail(std::string message) {
  ++count_;
  if (!error_) error_ = std::move(message);
}

void TraceColumnsBuilder::count_shape(std::uint64_t values, std::int32_t stack_index,
                                      bool empty, Handle container, Objects& objects) {
  nodes += values;
  if (stack_index >= 0) ++stack_uses[stack_index];
  if (empty) ++empty_frames;
  if (container != nullptr) {
    const auto [where, added] = container_uses.try_emplace(container, 0);
    if (added) objects.retain(container);
    ++where->second;
  }
}

void TraceColumnsBuilder::clear(Objects& objects) {
  for (const auto& [index, object] : metadata) objects.release(object);
  metadata.clear();
  for (const auto& [object, uses] : container_uses) objects.release(object);
  container_uses.clear();
}

}  // namespace stowage::snapshot
