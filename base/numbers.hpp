// Integer helpers for byte counts and addresses: rounding to a multiple, and the signed view
// that statistics take. Header-only, no state.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stowage {

// `value` rounded up to a multiple of `multiple` (> 0); the caller keeps it from overflowing.
constexpr std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// `value` rounded down to a multiple of `multiple` (> 0).
constexpr std::size_t round_down(std::size_t value, std::size_t multiple) {
  return value - value % multiple;
}

// A byte count as statistics hold it (every count stowage keeps is below 2^63).
constexpr std::int64_t as_signed(std::size_t bytes) { return static_cast<std::int64_t>(bytes); }

}  // namespace stowage
