// Memo: the pickle machine's memo (snapshot/machine.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "snapshot/objects.hpp"
#include "snapshot/value.hpp"

namespace stowage::snapshot {

// The memo: Values by index, as pickle's unpickler keeps them. Indices 0 to size() - 1 are held
// in chunks; an index stored beyond them (never written by Python's pickler) is held apart, as
// the unpickler's dict would. A chunk whose slots are all dead (kDead: events that became rows,
// which nothing may refer to again) is given back, so that a trace of millions of events costs
// the memo nothing once read. Owns one reference per Value that holds a handle; clear() gives
// them back. Not thread-safe.
class Memo {
 public:
  std::size_t size() const { return size_; }
  // The Value at a dense index (index < size()).
  const Value& at(std::size_t index) const;
  // The Value stored beyond the dense indices, or nullptr.
  const Value* sparse_at(std::size_t index) const;
  bool has_sparse() const { return !sparse_.empty(); }
  std::size_t sparse_size() const { return sparse_.size(); }

  // Stores `value` (whose reference the memo takes) at `index`: at size() it is appended (and
  // any sparse values that follow come into the dense indices); below, the old Value is
  // returned, for the caller to release; beyond, it is held apart.
  Value store(std::size_t index, Value value);
  void push(Value value);
  // Marks a dense slot dead (its old Value holds no reference).
  void kill(std::size_t index);
  // Gives back every reference the memo holds.
  void clear(Objects& objects);

 private:
  static constexpr std::size_t kChunkBits = 12;
  static constexpr std::size_t kChunk = std::size_t{1} << kChunkBits;
  struct Chunk {
    std::unique_ptr<Value[]> slots;
    std::uint32_t dead = 0;
  };
  Value& slot(std::size_t index);
  void append(Value value);

  std::vector<Chunk> chunks_;
  std::size_t size_ = 0;
  std::unordered_map<std::size_t, Value> sparse_;
};

}  // namespace stowage::snapshot
