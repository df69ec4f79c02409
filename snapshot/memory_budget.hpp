// MemoryBudget: how far one reading may grow the process's memory (Note [Reading snapshots],
// "Memory", in snapshot/reader.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "snapshot/limits.hpp"

namespace stowage::snapshot {

// The process's resident memory now, in bytes (Linux: /proc/self/statm), or nullopt where it
// cannot be read.
std::optional<std::uint64_t> resident_bytes();

// What a reading may add to the process's memory: kMemoryFloor and `per_byte` bytes a byte of
// pickle, at most `ceiling`; `remedy` ends the refusal's message (what to do instead).
struct MemoryBound {
  std::uint64_t per_byte = kColumnsMemoryPerByte;
  std::uint64_t ceiling = kMemoryCeiling;
  std::string remedy;
};

// What a refusal of a reading into columns says to do, for a pickle of `pickle_size` bytes read by
// `command` (the command line that read it; empty: a program's call): the ceiling to set, in whole
// GiB (2 at least), and where to set it.
std::string columns_remedy(std::uint64_t pickle_size, const std::string& command);

// The budget of one reading (MemoryBound). check() measures it, with what the reading will still
// make of what it holds (`planned`: Python's dicts of a trace's rare fields, its stacks as lists),
// and throws Refused once the two pass the budget.
// Where resident memory cannot be read it checks nothing (the plain-data walk still bounds what
// a reading returns). Not thread-safe: one per reading.
class MemoryBudget {
 public:
  // `start`: the resident memory growth is measured from (nullopt: now).
  MemoryBudget(std::uint64_t pickle_size, MemoryBound bound, std::optional<std::uint64_t> start = std::nullopt);
  void check(std::uint64_t position, std::uint64_t planned = 0) const;
  std::uint64_t budget() const { return budget_; }

 private:
  std::optional<std::uint64_t> start_;
  MemoryBound bound_;
  std::uint64_t budget_;
};

}  // namespace stowage::snapshot
