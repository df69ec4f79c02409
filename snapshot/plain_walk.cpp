#include "snapshot/plain_walk.hpp"

#include <algorithm>

#include "snapshot/limits.hpp"
#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

namespace {

constexpr std::uint64_t kOnPath = ~std::uint64_t{0};

std::uint64_t key_of(Handle object) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(object)); }

std::uint64_t mix(std::uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  return key;
}

std::uint64_t saturated(std::uint64_t a, std::uint64_t b, std::uint64_t cap) {
  return a > cap || b > cap - a ? cap + 1 : a + b;
}

}  // namespace

PlainWalk::PlainWalk(Objects& objects, std::uint64_t budget) : objects_(objects), budget_(budget) {
  table_.resize(1024);
}

void PlainWalk::set_traces(Handle device_traces, std::vector<const TraceColumnsBuilder*> traces,
                           const StackTable& stacks) {
  device_traces_ = device_traces;
  traces_ = std::move(traces);
  stacks_ = &stacks;
}

std::uint64_t* PlainWalk::find(std::uint64_t key) {
  const std::size_t mask = table_.size() - 1;
  for (std::size_t at = mix(key) & mask;; at = (at + 1) & mask) {
    if (table_[at].first == key) return &table_[at].second;
    if (table_[at].first == 0) return nullptr;
  }
}

void PlainWalk::remember(std::uint64_t key, std::uint64_t packed) {
  if (std::uint64_t* found = find(key)) {
    *found = packed;
    return;
  }
  if (2 * (used_ + 1) > table_.size()) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> old(table_.size() * 2);
    old.swap(table_);
    used_ = 0;
    for (const auto& [stored, value] : old) {
      if (stored != 0) remember(stored, value);
    }
  }
  const std::size_t mask = table_.size() - 1;
  std::size_t at = mix(key) & mask;
  while (table_[at].first != 0) at = (at + 1) & mask;
  table_[at] = {key, packed};
  ++used_;
}

bool PlainWalk::is_leaf(std::uint64_t key) {
  if ((key & 7) != 0) return false;
  const Kind kind = objects_.kind_of(reinterpret_cast<Handle>(static_cast<std::uintptr_t>(key)));
  return kind != Kind::kList && kind != Kind::kDict && kind != Kind::kTuple;
}

bool PlainWalk::add_children(std::uint64_t key, std::size_t& cursor) {
  const std::uint64_t tag = key & 7;
  if (tag == kShapeTag) {
    const TraceColumnsBuilder& trace = *traces_[key >> 3];
    for (const auto& [stack, uses] : trace.stack_uses) {
      children_.push_back({(static_cast<std::uint64_t>(stack) << 3) | kStackTag, uses});
    }
    if (trace.empty_frames != 0) children_.push_back({kEmptyTag, trace.empty_frames});
    for (const auto& [container, uses] : trace.container_uses) children_.push_back({key_of(container), uses});
    return false;
  }
  if (tag == kStackTag) {
    for (const Handle frame : stacks_->stacks()[static_cast<std::size_t>(key >> 3)]) children_.push_back({key_of(frame), 1});
    return false;
  }
  if (tag == kEmptyTag) return false;
  const Handle object = reinterpret_cast<Handle>(static_cast<std::uintptr_t>(key));
  if (object == device_traces_ && device_traces_ != nullptr) {
    for (std::size_t i = 0; i < traces_.size(); ++i) children_.push_back({(i << 3) | kShapeTag, 1});
    return false;
  }
  scratch_.clear();
  const bool more = objects_.children(object, cursor, kChunk, scratch_);
  for (const Handle child : scratch_) children_.push_back({key_of(child), 1});
  return more;
}

void PlainWalk::push(std::uint64_t key, std::uint64_t weight) {
  if (path_.size() >= static_cast<std::size_t>(kMaxDepth)) {
    SNAPSHOT_REFUSE("nested deeper than ", kMaxDepth, " levels: not a snapshot");
  }
  const bool memoized = (key & 7) != 0 || objects_.shared(reinterpret_cast<Handle>(static_cast<std::uintptr_t>(key)));
  if (memoized) remember(key, kOnPath);
  const std::size_t begin = children_.size();
  std::size_t cursor = 0;
  const bool more = add_children(key, cursor);
  path_.push_back(Frame{key, begin, children_.size(), begin, weight, 0, 0, memoized, more, cursor});
}

void PlainWalk::finish() {
  const Frame done = path_.back();
  path_.pop_back();
  children_.resize(done.begin);
  std::uint64_t size = saturated(done.size, 1, budget_);
  int depth = done.depth;
  if ((done.key & 7) == kShapeTag) {
    const TraceColumnsBuilder& trace = *traces_[done.key >> 3];
    size = saturated(size, trace.nodes, budget_);
    depth = trace.count() != 0 ? depth + 1 : 0;
  }
  if (size > budget_) {
    SNAPSHOT_REFUSE("expands to more than ", with_commas(budget_),
                    " values: not a snapshot (a memo bomb expands a few bytes into a huge graph)");
  }
  if (depth + 1 > kMaxDepth) SNAPSHOT_REFUSE("nested deeper than ", kMaxDepth, " levels: not a snapshot");
  if (done.memoized) remember(done.key, size << 8 | static_cast<std::uint64_t>(depth + 1));
  if (path_.empty()) return;
  Frame& parent = path_.back();
  const std::uint64_t weighted = done.weight > budget_ / std::max<std::uint64_t>(size, 1) ? budget_ + 1 : done.weight * size;
  parent.size = saturated(parent.size, weighted, budget_);
  parent.depth = std::max(parent.depth, depth + 1);
}

void PlainWalk::check(Handle root) {
  if (is_leaf(key_of(root))) return;
  push(key_of(root), 1);
  while (!path_.empty()) {
    Frame& frame = path_.back();
    if (frame.next == frame.end && frame.more) {  // the next of an object's children, in place of those walked
      children_.resize(frame.begin);
      frame.more = add_children(frame.key, frame.cursor);
      frame.end = children_.size();
      frame.next = frame.begin;
      continue;
    }
    if (frame.next == frame.end) {
      finish();
      continue;
    }
    const Child child = children_[frame.next++];
    if (is_leaf(child.key)) {
      frame.size = saturated(frame.size, child.weight, budget_);
      continue;
    }
    if (const std::uint64_t* known = find(child.key)) {
      if (*known == kOnPath) SNAPSHOT_REFUSE("contains itself: not a snapshot");
      const std::uint64_t size = *known >> 8;
      const std::uint64_t weighted = child.weight > budget_ / std::max<std::uint64_t>(size, 1) ? budget_ + 1 : child.weight * size;
      frame.size = saturated(frame.size, weighted, budget_);
      frame.depth = std::max(frame.depth, static_cast<int>(*known & 0xff));
      continue;
    }
    push(child.key, child.weight);
  }
}

}  // namespace stowage::snapshot
