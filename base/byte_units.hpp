// Byte counts as people write them: "4GiB", "512 MiB", "1.5GB", "1048576".
//
// parse_byte_size accepts a non-negative number (integer or decimal) followed by an optional
// unit: B, KiB/MiB/GiB/TiB (powers of 1024) or KB/MB/GB/TB (powers of 1000), case-insensitive,
// spaces allowed between. Anything else throws LogicError naming the text. format_bytes writes
// the shortest binary unit with two decimals ("1.50 GiB"), or plain bytes below 1 KiB.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/numbers.hpp"

namespace stowage {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;

std::size_t parse_byte_size(std::string_view text);
std::string format_bytes(std::size_t bytes);

// 1234567 -> "1,234,567", as Python's format(n, ",").
std::string with_commas(std::uint64_t value);

}  // namespace stowage
