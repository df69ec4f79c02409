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
//   virtual_memory:MODE   auto | on | off. Which memory source serves the shared pool: "on"
//                         maps physical pages into reserved address ranges (Note [Paged path]
//                         in paged_source.hpp: expandable segments, stitching), so free memory
//                         anywhere serves any request; "off" uses whole segments (cudaMalloc,
//                         segment_source.hpp), as PyTorch does by default; "auto" takes the
//                         paged path when the device supports virtual memory. "on" fails on a
//                         device without it. Default: auto, because the paged path needs least
//                         memory (bench/results/2026-11-22-cpu-fragmentation.md).
//   reserve_headroom:F    0 <= F <= 1: how far reserved memory may exceed the most bytes ever
//                         in use before the sources make room instead of growing (Note [Reserve
//                         budget] in reserve_budget.hpp): the paged path moves cached pages
//                         (once past move_pages_above), which costs map/unmap calls and a wait
//                         for the stream that last used them; the segment path returns wholly
//                         free segments. Default: 0.05, with which the segment path reserves no
//                         more than PyTorch's allocator on any recorded trace while the paged
//                         path still fits a device within 2 per cent of the peak
//                         (bench/results/2026-11-24-cpu-steady-state.md). 1 turns the rule off:
//                         new memory whenever the device has room, and on the segment path wholly
//                         free segments carved for much smaller requests (Note [Splitting]):
//                         PyTorch's policy.
//   move_pages_above:F    0 <= F <= 1. Paged path: new pages are made freely while reserved
//                         memory stays within F x the memory limit; only beyond it does the
//                         reserve budget make cached pages move instead (Note [Stitching] in
//                         page_stitcher.hpp). So while the device has room a training loop,
//                         whatever its shapes, keeps its pages mapped and stops calling the
//                         device once warm; close to the cap memory comes first. Default: 0.9.
//                         0 moves pages whenever the budget says so, whatever the room (the
//                         policy before this knob); 1 spends the whole device first.
//   placement:MODE        dynamic | learned. Paged path only (Note [Learned placement] in
//                         learned_placement.hpp). "learned" watches for the training step to
//                         repeat (stowage.mark_step() marks it; without marks the repetition is
//                         found in the allocation sequence), then places each allocation of the
//                         step at an address laid out from the recorded lifetimes, in an arena of
//                         its own, and falls back to the dynamic path the moment the sequence
//                         departs from the layout. Default: dynamic, because on the recorded traces
//                         learned placement reserves the same as the dynamic path (a step must
//                         repeat before a layout exists, so the peak is mostly set before) while
//                         replays run slower (bench/results/2026-11-22-cpu-learned-placement.md).
//                         Needs virtual memory (virtual_memory:off with placement:learned is
//                         refused).
//
// An empty string gives the defaults. Unknown keys, repeated keys and bad values throw
// LogicError naming the key and what was expected: a typo never passes silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace stowage {

enum class VirtualMemoryMode : std::uint8_t { kAuto, kOn, kOff };
enum class PlacementMode : std::uint8_t { kDynamic, kLearned };

struct AllocatorConfig {
  static constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();
  static constexpr double kDefaultReserveHeadroom = 0.05;
  static constexpr double kDefaultMovePagesAbove = 0.9;
  static constexpr PlacementMode kDefaultPlacement = PlacementMode::kDynamic;

  std::size_t max_split_size = kUnlimited;  // bytes
  std::size_t limit_bytes = kUnlimited;
  double memory_fraction = 1.0;
  VirtualMemoryMode virtual_memory = VirtualMemoryMode::kAuto;
  double reserve_headroom = kDefaultReserveHeadroom;
  double move_pages_above = kDefaultMovePagesAbove;
  PlacementMode placement = kDefaultPlacement;

  // The configuration as a string parse_allocator_config reads back (defaults omitted).
  std::string to_string() const;
};

AllocatorConfig parse_allocator_config(std::string_view text);

}  // namespace stowage
