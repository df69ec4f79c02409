// Fill patterns for tests that write device memory and check it later.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stowage::testing {

// A byte pattern that differs between seeds and along the buffer, so a misplaced or stale copy
// never matches by accident.
inline std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint32_t seed) {
  std::vector<std::uint8_t> out(bytes);
  std::uint32_t state = seed * 2654435761u + 1;
  for (auto& byte : out) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<std::uint8_t>(state >> 24);
  }
  return out;
}

}  // namespace stowage::testing
