// The snapshot reader's bounds (Note [Reading snapshots] in snapshot/reader.hpp): what a pickle
// may hold, and the memory and time a reading may take. stowage.snapshot_reader shows the same
// numbers to Python (stowage._core.snapshot_limits), so that each has one meaning.
#pragma once

#include <cstdint>

namespace stowage::snapshot {

// Containers nested deeper than this (tuples as they are made, anything once built) are refused:
// hashing a deep tuple recurses in C without limit, and no snapshot nests deeper than about 8.
inline constexpr int kMaxDepth = 64;
// Numbers at or beyond this magnitude, and NaN, are refused: integers that large can be chosen
// to collide in hash tables, and no snapshot field comes near (addresses are below 2**57).
inline constexpr std::int64_t kMaxNumber = std::int64_t{1} << 60;
// The tree a pickle stands for (its shared values counted once each time they are reached) may
// hold this many values a byte of pickle, and at least kMinNodeBudget: a memo bomb, whose few
// bytes stand for a tree of billions, is refused without being expanded.
inline constexpr std::uint64_t kNodesPerByte = 64;
inline constexpr std::uint64_t kMinNodeBudget = 1'000'000;
// The memory a reading may add to the process (Note [Reading snapshots], "Memory"): a floor and
// bytes a byte of pickle, at most a ceiling whatever the file's size, measured every kReportEvery
// bytes read. Read into columns, a trace whose every event has stack frames of its own (the
// densest torch writes: a dict a frame) takes up to about 11.5 bytes a byte; read as plain data, a
// snapshot shaped as torch writes it about 3.4.
inline constexpr std::uint64_t kMemoryFloor = std::uint64_t{96} << 20;
inline constexpr std::uint64_t kColumnsMemoryPerByte = 12;
inline constexpr std::uint64_t kPlainMemoryPerByte = 3;
inline constexpr std::uint64_t kMemoryCeiling = std::uint64_t{768} << 20;
inline constexpr const char* kCeilingVariable = "STOWAGE_SNAPSHOT_MEMORY";  // sets the ceiling in the environment
inline constexpr std::uint64_t kReportEvery = std::uint64_t{256} << 10;
// A large file's bytes behind the reader are given back this many at a time.
inline constexpr std::uint64_t kReleaseEvery = std::uint64_t{8} << 20;
// Trace fields' bounds (stowage.snapshot_reader.schema says the same).
inline constexpr std::uint64_t kMaxSize = std::uint64_t{1} << 50;  // bytes: far beyond any device
inline constexpr std::int64_t kMaxDevices = std::int64_t{1} << 16;
// The highest pickle protocol there is (5, Python 3.8 on).
inline constexpr int kHighestProtocol = 5;

// The values a pickle of `size` bytes may stand for, as a tree.
inline std::uint64_t node_budget(std::uint64_t size) {
  const std::uint64_t scaled = size > (~std::uint64_t{0}) / kNodesPerByte ? ~std::uint64_t{0}
                                                                          : size * kNodesPerByte;
  return scaled > kMinNodeBudget ? scaled : kMinNodeBudget;
}

}  // namespace stowage::snapshot
