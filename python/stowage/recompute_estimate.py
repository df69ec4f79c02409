"""The peak a recorded trace would have with each of the model's blocks checkpointed (recomputed
in backward), worked out from the trace and the module that made each allocation.

Blocks are the outermost modules with modules inside whose name ends in a number
(``transformer.h.3``, ``encoder_layer_5``, ``features.2``, torchvision ResNet's stages
``layer1``; not a lone ``conv1``): the items of a model's block lists, which
``torch.utils.checkpoint`` or ``gradient_checkpointing_enable()`` wrap. Activations freed before
their block's forward ends (what a region with saved-tensor hooks of its own held) stay as they
were. With a block
checkpointed, its forward keeps only what it returns (its last allocation still live when the
block's run ends, which the next block saves); the saved activations it made come back when its
backward begins (the first free of any of them, in backward) and go at their own frees, as
before; at that moment the re-run forward also holds, for an instant, the rest of what its
forward made at its peak (its temporaries, and a second copy of its output: the block's own
forward peak above the activations it brings back). Activations outside the blocks (embeddings, the
head, the loss) stay as they were.

Contract: pure functions of a trace's LivePairs, categories and module paths.
"""

from __future__ import annotations

import re

import numpy as np

_NUMBERED = re.compile(r"\d+$")


def block_of_paths(paths: list[str]) -> tuple[np.ndarray, list[str]]:
    """For each module path, the index of its block in the returned list of block paths (-1:
    inside none)."""
    blocks: dict[str, int] = {}
    out = np.full(len(paths), -1, dtype=np.int64)
    containers = {path.rsplit(".", 1)[0] for path in paths if "." in path}  # modules with modules inside
    for i, path in enumerate(paths):
        parts = path.split(".")
        for depth in range(1, len(parts)):  # the root (depth 0) is never a block
            if _NUMBERED.search(parts[depth]) and ".".join(parts[:depth + 1]) in containers:
                out[i] = blocks.setdefault(".".join(parts[:depth + 1]), len(blocks))
                break
    return out, list(blocks)


def checkpointed_shift(is_alloc: np.ndarray, end: np.ndarray, size: np.ndarray, own: np.ndarray,
                       activations: np.ndarray, block: np.ndarray) -> np.ndarray:
    """The change to the live series (to add to its running sum) if each block were checkpointed.
    `own`: LivePairs.own (each position's change of the live bytes); `activations`: the positions of the saved activations; `block`: every position's block (-1:
    none). Each run of a block (its consecutive allocations, one per forward) is handled apart."""
    n = len(is_alloc)
    delta = np.zeros(n + 1, dtype=np.int64)
    allocs = np.flatnonzero(is_alloc)
    in_block = allocs[block[allocs] >= 0]
    if not len(in_block):
        return delta[:n]
    ids = block[in_block]
    # Runs: consecutive block allocations with the same block (an allocation of another block,
    # or of none, ends a run).
    same_as_before = np.r_[False, (ids[1:] == ids[:-1]) & (np.searchsorted(allocs, in_block[1:]) -
                                                         np.searchsorted(allocs, in_block[:-1]) == 1)]
    run = np.cumsum(~same_as_before) - 1
    starts = np.flatnonzero(~same_as_before)
    run_last = np.r_[starts[1:], len(in_block)] - 1
    is_activation = np.zeros(n, dtype=bool)
    is_activation[activations] = True
    for r in range(len(starts)):
        members = in_block[starts[r]:run_last[r] + 1]
        first, last = int(members[0]), int(members[-1])
        live_at_end = members[end[members] > last]
        output = live_at_end[-1] if len(live_at_end) else -1
        moved = members[is_activation[members] & (members != output) & (end[members] > last) & (end[members] < n)]
        if not len(moved):
            continue
        # The block's backward begins just before the first of them is freed: its forward runs
        # again there (its own peak above what it keeps, for an instant), and they are back.
        back = int(end[moved].min()) - 1
        sizes = np.asarray(size[moved], dtype=np.int64)
        transient = max(0, int(np.cumsum(own[first:last + 1]).max()) - int(sizes.sum()))
        np.add.at(delta, moved, -sizes)  # not kept through forward ...
        delta[back] += int(sizes.sum()) + transient  # ... back when its backward begins
        delta[back + 1] -= transient
    return delta[:n]
