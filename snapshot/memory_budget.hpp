// MemoryBudget: how far one reading may grow the process's memory (Note [Reading snapshots],
// "Memory", in snapshot/reader.hpp).
#pragma once

#include <cstdint>
#include <optional>

namespace stowage::snapshot {

// The process's resident memory now, in bytes (Linux: /proc/self/statm), or nullopt where it
// cannot be read.
std::optional<std::uint64_t> resident_bytes();

// The budget of one reading: its resident memory may grow by kMemoryFloor and `per_byte` bytes a
// byte of pickle. check() measures it, with what the reading will still make of what it holds
// (`planned`: Python's dicts of a trace's rare fields, its stacks as lists), and throws Refused
// once the two pass the budget.
// Where resident memory cannot be read it checks nothing (the plain-data walk still bounds what
// a reading returns). Not thread-safe: one per reading.
class MemoryBudget {
 public:
  // `start`: the resident memory growth is measured from (nullopt: now).
  MemoryBudget(std::uint64_t pickle_size, std::uint64_t per_byte, std::optional<std::uint64_t> start = std::nullopt);
  void check(std::uint64_t position, std::uint64_t planned = 0) const;
  std::uint64_t budget() const { return budget_; }

 private:
  std::optional<std::uint64_t> start_;
  std::uint64_t per_byte_;
  std::uint64_t budget_;
};

}  // namespace stowage::snapshot
