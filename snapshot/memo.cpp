#include "snapshot/memo.hpp"

#include "base/errors.hpp"

namespace stowage::snapshot {

namespace {

Value dead_value() {
  Value dead;
  dead.kind = Kind::kDead;
  return dead;
}

const Value kDeadValue = dead_value();

}  // namespace

const Value& Memo::at(std::size_t index) const {
  const Chunk& chunk = chunks_[index >> kChunkBits];
  return chunk.slots ? chunk.slots[index & (kChunk - 1)] : kDeadValue;
}

Value& Memo::slot(std::size_t index) {
  Chunk& chunk = chunks_[index >> kChunkBits];
  STOWAGE_INTERNAL_ASSERT(chunk.slots != nullptr, "a memo slot of a chunk given back was written");
  return chunk.slots[index & (kChunk - 1)];
}

const Value* Memo::sparse_at(std::size_t index) const {
  const auto found = sparse_.find(index);
  return found == sparse_.end() ? nullptr : &found->second;
}

void Memo::append(Value value) {
  if ((size_ & (kChunk - 1)) == 0) {
    chunks_.push_back(Chunk{std::make_unique<Value[]>(kChunk), 0});
  }
  chunks_.back().slots[size_ & (kChunk - 1)] = value;
  ++size_;
}

void Memo::push(Value value) {
  append(value);
  while (!sparse_.empty()) {
    const auto next = sparse_.find(size_);
    if (next == sparse_.end()) break;
    append(next->second);
    sparse_.erase(next);
  }
}

Value Memo::store(std::size_t index, Value value) {
  if (index == size_) {
    push(value);
    return Value{};
  }
  if (index < size_) {
    Value& target = slot(index);
    const Value old = target;
    target = value;
    return old;
  }
  const auto [where, inserted] = sparse_.try_emplace(index, value);
  if (inserted) return Value{};
  const Value old = where->second;
  where->second = value;
  return old;
}

void Memo::kill(std::size_t index) {
  Chunk& chunk = chunks_[index >> kChunkBits];
  if (!chunk.slots) return;
  Value& target = chunk.slots[index & (kChunk - 1)];
  if (target.kind == Kind::kDead) return;
  target = kDeadValue;
  if (++chunk.dead == kChunk) chunk.slots.reset();  // every slot filled, and dead
}

void Memo::clear(Objects& objects) {
  for (std::size_t index = 0; index < size_; ++index) {
    const Value& value = at(index);
    if (owns_handle(value.kind)) objects.release(value.handle);
  }
  for (const auto& [index, value] : sparse_) {
    if (owns_handle(value.kind)) objects.release(value.handle);
  }
  chunks_.clear();
  sparse_.clear();
  size_ = 0;
}

}  // namespace stowage::snapshot
