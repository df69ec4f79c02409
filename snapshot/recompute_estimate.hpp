// The peak a recorded trace would have with each of the model's blocks checkpointed (recomputed
// in backward): the advice's saving for activations, where stowage's tags name the module that
// made each allocation (block_of_paths finds the blocks).
//
// Each run of a block (its consecutive allocations, one per forward) is handled apart: its
// forward keeps only what it returns (its last allocation still live when the run ends); the
// saved activations it made (those freed after the run, in backward) come back when its
// backward begins (just before the first of them is freed) and go at their own frees; at that
// moment the re-run forward also holds, for an instant, the rest of its own peak above what it
// brings back. Positions are LivePairs' (snapshot/peak_estimates.hpp); `own[p]` position p's
// change of the live bytes, `activations` the saved activations' positions, `block[p]` the block
// of each position (-1: none). Pure; bad arguments raise LogicError.
//
// Blocks are the outermost modules with modules inside whose name ends in a number
// (`transformer.h.3`, `encoder_layer_5`, `features.2`, torchvision ResNet's stages `layer1`; not
// a lone `conv1`): the items of a model's block lists, which torch.utils.checkpoint or
// gradient_checkpointing_enable() wrap. Activations freed before their block's forward ends (what
// a region with saved-tensor hooks of its own held) stay as they were; so do activations outside
// the blocks (embeddings, the head, the loss).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

// The blocks among module paths (dotted, the root ""), in the order first met, and each path's
// block (an index into `blocks`; -1: inside none). A name ends in a number as Python's
// re.search(r"\d+$") finds one (a final newline let through), in ASCII digits. Pure.
struct PathBlocks {
  std::vector<std::int64_t> block_of_path;
  std::vector<std::string> blocks;
};
PathBlocks block_of_paths(std::span<const std::string> paths);

Wide checkpointed_peak(const LiveSeries& live, std::span<const std::uint8_t> is_alloc,
                       std::span<const std::int64_t> end, std::span<const std::int64_t> size,
                       std::span<const std::int64_t> own, std::span<const std::int64_t> activations,
                       std::span<const std::int64_t> block);

}  // namespace stowage::snapshot
