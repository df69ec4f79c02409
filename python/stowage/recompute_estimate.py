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

This module finds the blocks; the trace is re-simulated in C++ (snapshot/recompute_estimate.hpp's
checkpointed_peak, called by the advice). Contract: a pure function of module paths.
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
