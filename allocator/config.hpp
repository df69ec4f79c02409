// The allocator's configuration, parsed once from the "key:value,key:value" syntax that the
// STOWAGE_ALLOC_CONF variable, stowage.enable() and `stowage replay --config` share (the same
// syntax as PYTORCH_CUDA_ALLOC_CONF). Every knob, its default and why:
//
//   max_split_size_mb:N   Requests of N MiB or more are "oversize": their blocks are never
//                         split, and they reuse only cached blocks at most 20 MiB larger, so
//                         huge blocks are not carved up by small requests. Default: unlimited
//                         (PyTorch's default), because splitting is what lets memory be reused.
//                         Must be more than 20 (MiB), the medium segment size, as in PyTorch.
//   limit:SIZE            Reserve at most SIZE ("12GiB", bytes, ...) from the device. Default:
//                         none (the device's capacity is the limit).
//   memory_fraction:F     Reserve at most F (0 < F <= 1) of the device's memory; with limit,
//                         the smaller wins. Default: 1.
//
// An empty string gives the defaults. Unknown keys, repeated keys and bad values throw
// LogicError naming the key and what was expected: a typo never passes silently.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

namespace stowage {

struct AllocatorConfig {
  static constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

  std::size_t max_split_size = kUnlimited;  // bytes
  std::size_t limit_bytes = kUnlimited;
  double memory_fraction = 1.0;

  // The configuration as a string parse_allocator_config reads back (defaults omitted).
  std::string to_string() const;
};

AllocatorConfig parse_allocator_config(std::string_view text);

}  // namespace stowage
