// How request sizes become block and segment sizes (Note [Rounding], Note [Splitting]).
//
// Note [Rounding]
// Every request is rounded up to a multiple of 512 B, in both size classes. PyTorch rounds large
// blocks to 2 MiB steps in effect (its segments are 2 MiB multiples and it splits only
// remainders above 1 MiB), which costs memory on real training traces
// (bench/results/2026-11-22-cpu-fragmentation.md), so stowage keeps 512 B granularity everywhere
// and leaves coarseness to segment sizing.
//
// Requests of up to 1 MiB (after rounding) are of the small class, packed into 2 MiB segments;
// larger ones are of the large class. A large request under 10 MiB gets a shared segment
// of 16 to 24 MiB, so that several medium blocks share one segment instead of each paying for
// its own rounding. Of the sizes in that range that are a whole number of the request's blocks
// rounded up to 2 MiB, the one that wastes the least is taken (the larger on a tie): a model's
// medium tensors come in a few sizes, many of each, and a segment that holds a whole number of
// them leaves no tail that none of them fits (a fixed 20 MiB segment holds two 7.8 MiB blocks
// and strands 4.4 MiB; 16 MiB holds two and strands 0.4; the effect on the recorded traces is in
// bench/results/2026-11-22-cpu-segment-path.md). From 10 MiB up a segment is the request rounded
// up to 2 MiB. When the device cannot give the preferred size, the smallest segment that holds
// the block is asked for instead. Small and large blocks never share a segment: small,
// short-lived blocks would otherwise pin large segments.
//
// Note [Splitting]
// A free block bigger than the request is split only when the remainder is worth keeping:
//   - small class: the remainder is at least 512 B, the smallest block there is; anything
//     smaller could never be used and would only lengthen the free index;
//   - large class: the remainder is larger than 1 MiB, so it can hold a large request on its own.
//     A smaller remainder could only ever be used by merging with a neighbour once that is
//     freed, and as a separate free block it would sit in the index as a sliver no request
//     fits; keeping it inside the block costs at most 1 MiB while the block lives and returns
//     it the moment the block is freed.
//   - blocks of the oversize class (requests of max_split_size or more) are never split: huge
//     blocks carved up by small requests are what leaves large holes unusable. One exception:
//     a block the paged path has just formed from new pages for an oversize request gives back
//     the partial page at its end, which is no part of a huge cached block;
//   - on the segment path, a segment that is wholly free is not carved for a request of less than
//     a fifth of it when more than 64 MiB would be left over, while the device can give the
//     request a segment of its own (the free one may go back to make room: Note [Reserve
//     budget]; so with reserve_headroom:1, which never gives segments back, segments are
//     carved as in PyTorch). The small block would pin the whole segment until it is freed,
//     and the next request the segment was made for would no longer fit
//     (bench/results/2026-11-22-cpu-segment-path.md). When the device has no room the segment
//     is carved after all.
//   - on the paged path (Note [Paged path]) any remainder of 512 B or more is split off in the
//     large class too. There a remainder kept inside a block wastes its bytes on a page that is
//     mapped anyway, while a free one joins its neighbour the moment that is freed, and its
//     whole pages can be moved, which lowers the memory the recorded traces need
//     (bench/results/2026-11-22-cpu-fragmentation.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/numbers.hpp"

namespace stowage {

// Requests of up to kSmallRequestMax are of the small class, larger ones of the large class; the
// two never share a segment (Note [Rounding]). torch's statistics call them the small and large
// pools.
enum class SizeClass : std::uint8_t { kSmall = 0, kLarge = 1 };
inline constexpr std::size_t kSizeClasses = 2;
constexpr std::size_t index_of(SizeClass size_class) noexcept {
  return static_cast<std::size_t>(size_class);
}

struct SizePolicy {
  static constexpr std::size_t kMinBlockSize = 512;             // rounding step, both classes
  static constexpr std::size_t kSmallRequestMax = 1 << 20;      // 1 MiB: largest small request
  static constexpr std::size_t kSmallSegmentSize = 2 << 20;     // 2 MiB small segments
  static constexpr std::size_t kMediumRequestMax = 10 << 20;    // under 10 MiB: a shared segment
  static constexpr std::size_t kMediumSegmentSize = 20 << 20;   // 20 MiB: the usual shared one
  static constexpr std::size_t kMediumSegmentMin = 16 << 20;    // Note [Rounding]: the range a
  static constexpr std::size_t kMediumSegmentMax = 24 << 20;    // shared segment is sized in
  static constexpr std::size_t kLargeSegmentRounding = 2 << 20; // 2 MiB
  static constexpr std::size_t kLargeSplitMinimum = 1 << 20;    // large remainders must exceed this
  static constexpr std::size_t kSparedSegmentRatio = 5;          // Note [Splitting]: whole free
  static constexpr std::size_t kSparedSegmentRemainder = 64 << 20;  // segments spared
  // Larger requests cannot be rounded without overflow; they fail as out of memory.
  static constexpr std::size_t kMaxRequest = std::size_t{1} << 62;

  // The block size for a request of `bytes` (0 < bytes <= kMaxRequest).
  static constexpr std::size_t block_size(std::size_t bytes) {
    return bytes < kMinBlockSize ? kMinBlockSize : round_up(bytes, kMinBlockSize);
  }

  static constexpr SizeClass size_class_for(std::size_t block_bytes) {
    return block_bytes <= kSmallRequestMax ? SizeClass::kSmall : SizeClass::kLarge;
  }

  // The size of a new segment for a block of `block_bytes`.
  static constexpr std::size_t segment_size(std::size_t block_bytes) {
    if (block_bytes <= kSmallRequestMax) return kSmallSegmentSize;
    if (block_bytes < kMediumRequestMax) return medium_segment_size(block_bytes);
    return round_up(block_bytes, kLargeSegmentRounding);
  }

  // Note [Rounding]: the shared segment for a medium block (kSmallRequestMax < block_bytes <
  // kMediumRequestMax) that holds a whole number of such blocks with the least waste.
  static constexpr std::size_t medium_segment_size(std::size_t block_bytes) {
    std::size_t best = 0;  // none yet
    std::size_t best_waste = 0;
    for (std::size_t used = block_bytes; used <= kMediumSegmentMax; used += block_bytes) {
      const std::size_t size = round_up(used, kLargeSegmentRounding);
      if (size < kMediumSegmentMin || size > kMediumSegmentMax) continue;
      const std::size_t waste = size - used;
      // waste / size <= best_waste / best, cross-multiplied
      if (best == 0 || waste * best <= best_waste * size) {
        best = size;
        best_waste = waste;
      }
    }
    return best == 0 ? kMediumSegmentSize : best;
  }

  // The least a segment for `block_bytes` can be: what is asked for when the preferred size
  // does not fit the device (near out of memory, a shared 20 MiB segment is a luxury).
  static constexpr std::size_t smallest_segment_size(std::size_t block_bytes) {
    if (block_bytes <= kSmallRequestMax) return kSmallSegmentSize;
    return round_up(block_bytes, kLargeSegmentRounding);
  }

  // Note [Splitting], segment path: whether a wholly free segment of `segment_bytes` is kept
  // whole rather than carved for a block of `block_bytes`, while a new segment can be had.
  static constexpr bool spares_whole_segment(std::size_t segment_bytes, std::size_t block_bytes) {
    return segment_bytes / kSparedSegmentRatio >= block_bytes &&
           segment_bytes - block_bytes > kSparedSegmentRemainder;
  }

  // Note [Splitting]. `oversize`: the request is of the oversize class; `paged`: the block is
  // on the paged path.
  static constexpr bool should_split(SizeClass size_class, std::size_t remainder, bool oversize,
                                     bool paged) {
    if (oversize) return false;
    if (size_class == SizeClass::kSmall || paged) return remainder >= kMinBlockSize;
    return remainder > kLargeSplitMinimum;
  }
};

}  // namespace stowage
