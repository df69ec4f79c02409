// The opcodes that make and fill containers, and the memo's.
#include <algorithm>

#include "snapshot/limits.hpp"
#include "snapshot/machine.hpp"
#include "snapshot/opcodes.hpp"
#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

namespace {

// A new reference given back when it goes out of scope.
class Owned {
 public:
  Owned(Objects& objects, Handle object) : objects_(objects), object_(object) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { objects_.release(object_); }
  Handle get() const { return object_; }

 private:
  Objects& objects_;
  Handle object_;
};

constexpr const char* kTupleKey =
    "a dict key is a tuple: snapshots key dicts by strings (tuples can be built to collide in hash tables)";

}  // namespace

bool Machine::step_containers(std::uint8_t opcode) {
  const std::size_t at = pos_ - 1;
  switch (opcode) {
    case op::kEmptyTuple: make_tuple({}); return true;
    case op::kTuple1: tuple_n(1); return true;
    case op::kTuple2: tuple_n(2); return true;
    case op::kTuple3: tuple_n(3); return true;
    case op::kTuple:
    case op::kList:
    case op::kDict: close_mark(opcode); return true;
    case op::kBinPut: put(take_uint(1), at); return true;
    case op::kLongBinPut: put(take_uint(4), at); return true;
    case op::kPop:
      if (stack_.size() > region_start()) {
        if (stream_ != nullptr) stream_->dropped(stack_.back());
        release(pop());
      } else if (marks_.empty()) {
        throw BadPickle("unpickling stack underflow");
      } else {
        marks_.pop_back();  // as pickle: POP with nothing above the mark pops the mark
      }
      return true;
    case op::kPopMark: {
      const std::span<Value> items = pop_mark();
      if (stream_ != nullptr) {
        for (const Value& item : items) stream_->dropped(item);
      }
      const std::size_t start = stack_.size() - items.size();
      drop(items);
      stack_.resize(start);
      return true;
    }
    case op::kDup: {
      const Value value = top();
      if (stream_ != nullptr) stream_->duplicated(value);
      if (owns_handle(value.kind)) objects_.retain(value.handle);
      push(value);
      return true;
    }
    default: return false;
  }
}

void Machine::empty_dict() {
  if (stream_ != nullptr) {
    if (const std::optional<Value> event = stream_->new_dict(view())) {
      push(*event);
      return;
    }
  }
  push(Value::of_handle(Kind::kDict, objects_.make_dict()));
}

void Machine::empty_list() {
  if (stream_ != nullptr) {
    if (const std::optional<Value> made = stream_->new_list(view())) {
      push(*made);
      return;
    }
  }
  push(Value::of_handle(Kind::kList, objects_.make_list({})));
}

void Machine::no_tuple_keys(std::span<const Value> items, std::size_t stride) const {
  for (std::size_t i = 0; i < items.size(); i += stride) {
    if (items[i].kind == Kind::kTuple && items[i].filled != 0) SNAPSHOT_REFUSE(kTupleKey);
  }
}

// SETITEMS (the items above the last mark) and SETITEM (the last two) into the dict below them.
void Machine::set_items(bool many) {
  std::size_t start;
  if (many) {
    start = stack_.size() - pop_mark().size();
  } else {
    if (stack_.size() - region_start() < 2) throw BadPickle("unpickling stack underflow");
    start = stack_.size() - 2;
  }
  if (start <= region_start()) throw BadPickle("unpickling stack underflow");
  const Value target = stack_[start - 1];
  const std::span<const Value> items = std::span<const Value>(stack_.data(), stack_.size()).subspan(start);
  if (target.kind == Kind::kEvent || target.kind == Kind::kDict) {
    if (items.size() % 2 != 0) throw BadPickle("odd number of items for SETITEMS");
  }
  if (target.kind == Kind::kEvent) {
    stream_->set_items(target, items);  // takes the items' references
    stack_.resize(start);
    return;
  }
  if (target.kind != Kind::kDict) {
    if (target.kind >= Kind::kEvent || (target.kind == Kind::kList && stream_ != nullptr && stream_->frozen(target.handle))) {
      throw ReadWhole();
    }
    throw BadPickle(std::string("SETITEMS to a ") + type_name(target.kind));
  }
  no_tuple_keys(items, 2);
  for (std::size_t i = 0; i < items.size(); i += 2) {
    const Owned key(objects_, object_of(items[i]));
    const Owned value(objects_, object_of(items[i + 1]));
    objects_.set_item(target.handle, key.get(), value.get());
  }
  drop(items);
  stack_.resize(start);
}

// APPENDS (the items above the last mark) and APPEND (the last one) to the list below them.
void Machine::appends(bool many) {
  std::size_t start;
  if (many) {
    start = stack_.size() - pop_mark().size();
  } else {
    if (stack_.size() <= region_start()) throw BadPickle("unpickling stack underflow");
    start = stack_.size() - 1;
  }
  if (start <= region_start()) throw BadPickle("unpickling stack underflow");
  const Value target = stack_[start - 1];
  const std::span<const Value> items = std::span<const Value>(stack_.data(), stack_.size()).subspan(start);
  if (items.empty()) {
    stack_.resize(start);  // as pickle: an APPENDS of nothing does not look at its target
    return;
  }
  if (target.kind == Kind::kTrace || target.kind == Kind::kDeviceTraces || target.kind == Kind::kEventList) {
    stream_->append(target, items);  // takes the items' references
    stack_.resize(start);
    return;
  }
  if (target.kind != Kind::kList) {
    if (target.kind >= Kind::kEvent) throw ReadWhole();
    throw BadPickle(std::string("APPENDS to a ") + type_name(target.kind));
  }
  if (stream_ != nullptr && stream_->frozen(target.handle)) throw ReadWhole();
  {
    objects_of(items);
    const ScratchHeld held{*this};
    objects_.extend(target.handle, scratch_);
  }
  drop(items);
  stack_.resize(start);
}

void Machine::make_tuple(std::span<const Value> items) {
  int depth = 1;
  for (const Value& item : items) {
    if (item.kind == Kind::kTuple) depth = std::max(depth, 1 + item.aux);
  }
  if (depth > kMaxDepth) SNAPSHOT_REFUSE("tuples nested deeper than ", kMaxDepth, " levels: not a snapshot");
  Handle tuple = nullptr;
  {
    objects_of(items);
    const ScratchHeld held{*this};
    tuple = objects_.make_tuple(scratch_);
  }
  Value made = Value::of_handle(Kind::kTuple, tuple);
  made.aux = static_cast<std::uint16_t>(depth);
  made.filled = items.empty() ? 0 : 1;
  const std::size_t start = stack_.size() - items.size();
  drop(items);
  stack_.resize(start);
  push(made);
}

void Machine::tuple_n(std::size_t count) {
  if (stack_.size() - region_start() < count) throw BadPickle("unpickling stack underflow");
  make_tuple(std::span<const Value>(stack_.data(), stack_.size()).subspan(stack_.size() - count));
}

// TUPLE, LIST and DICT: the items above the last mark become one container.
void Machine::close_mark(std::uint8_t opcode) {
  const std::span<Value> items = pop_mark();
  const std::size_t start = stack_.size() - items.size();
  if (stream_ != nullptr && start > region_start() && stack_[start - 1].kind == Kind::kTrace) {
    throw ReadWhole();  // a trace's MARK closed by other than APPENDS
  }
  if (opcode == op::kTuple) {
    make_tuple(items);
    return;
  }
  if (opcode == op::kList) {
    Handle list = nullptr;
    {
      objects_of(items);
      const ScratchHeld held{*this};
      list = objects_.make_list(scratch_);
    }
    drop(items);
    stack_.resize(start);
    push(Value::of_handle(Kind::kList, list));
    return;
  }
  if (items.size() % 2 != 0) throw BadPickle("odd number of items for DICT");
  no_tuple_keys(items, 2);
  const Owned dict(objects_, objects_.make_dict());
  for (std::size_t i = 0; i < items.size(); i += 2) {
    const Owned key(objects_, object_of(items[i]));
    const Owned value(objects_, object_of(items[i + 1]));
    objects_.set_item(dict.get(), key.get(), value.get());
  }
  drop(items);
  stack_.resize(start);
  objects_.retain(dict.get());
  push(Value::of_handle(Kind::kDict, dict.get()));
}

void Machine::objects_of(std::span<const Value> items) {
  release_scratch();
  try {
    for (const Value& item : items) scratch_.push_back(object_of(item));
  } catch (...) {
    release_scratch();
    throw;
  }
}

void Machine::release_scratch() {
  for (const Handle made : scratch_) objects_.release(made);
  scratch_.clear();
}

void Machine::get(std::uint64_t index, std::size_t at) {
  const Value* found = nullptr;
  if (index < memo_.size()) found = &memo_.at(static_cast<std::size_t>(index));
  else if (memo_.has_sparse()) found = memo_.sparse_at(static_cast<std::size_t>(index));
  if (found == nullptr) {
    if (index > size_) SNAPSHOT_REFUSE("memo index ", index, " at byte ", at, " is beyond the file");
    throw BadPickle("memo value not found at index " + std::to_string(index));
  }
  if (stream_ != nullptr) stream_->got(*found);
  if (owns_handle(found->kind)) objects_.retain(found->handle);
  push(*found);
}

void Machine::put(std::uint64_t index, std::size_t at) {
  const Value value = top();
  if (index > size_) SNAPSHOT_REFUSE("memo index ", index, " at byte ", at, " is beyond the file");
  const auto slot = static_cast<std::size_t>(index);
  const bool appended = slot == memo_.size();
  if (stream_ != nullptr) {
    if (slot > memo_.size()) throw ReadWhole();  // sparse memo indices: never written by Python's pickler
    stream_->memoized(value, slot, appended, appended ? Value{} : memo_.at(slot));
  }
  if (owns_handle(value.kind)) objects_.retain(value.handle);
  release(memo_.store(slot, value));
}

void Machine::memoize() {
  const Value value = top();
  if (memo_.has_sparse()) {
    put(memo_.size() + memo_.sparse_size(), pos_ - 1);
    return;
  }
  if (stream_ != nullptr) stream_->memoized(value, memo_.size(), true, Value{});
  if (owns_handle(value.kind)) objects_.retain(value.handle);
  memo_.push(value);
}

}  // namespace stowage::snapshot
