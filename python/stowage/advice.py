"""Advice the inspector gives: each rule names a waste it sees in the trace, the bytes the peak
would lose without it, and the call that removes it.

The saving is computed from the trace, not guessed: the live-bytes series is re-simulated
without the allocations the advice would remove (every one of the waste's, over the whole trace,
from its allocation to its free: moving the optimizer to the host takes its states and its
update's temporaries; offloading activations takes every step's) and the new peak taken; the
saving is the old peak less the new.

Rules (each fires only where its waste is at least MIN_SHARE of the peak):
- optimizer states at the peak -> stowage.offload.AdamW (states in host memory) or stowage.fit;
- activations at the peak -> stowage.offload.activations or a plan (stowage.plan / stowage.fit);
- gradients at the peak made in an earlier step (kept across steps: zero_grad(set_to_none=False),
  or none) -> optimizer.zero_grad(set_to_none=True) after each step;
- memory that grows at every step -> the site that keeps it (a loss kept with its graph: .item()
  or .detach());
- an out-of-memory with enough bytes free but no block whole (reserved but unallocated) ->
  stowage's allocator, with the replay's peak reserved where the inspector has it;
- inputs at the peak -> a smaller batch or micro-batches (stowage.fit(..., micro_batches="auto")).

Contract: pure functions of the inspector's findings and the trace's LivePairs.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from stowage._core import format_bytes

MIN_SHARE = 0.10

CALLS = {
    "optimizer states": "keep them in host memory: stowage.offload.AdamW(params, ...) in place of torch's, or "
                        "stowage.fit(model, factory, batch) to choose the share",
    "activations": "offload or recompute them: `with stowage.offload.activations():` around forward and backward, "
                   "or a plan (stowage.plan.profile / solve, or stowage.fit)",
    "inputs": "train on smaller micro-batches of the same global batch: stowage.fit(..., micro_batches=\"auto\")",
}


# Rules whose saving is a bound: offloaded activations come back in backward, a block or a few
# ahead of their use, which the re-simulation does not model (measured on an MLP: 56% of it).
UPPER_BOUNDS = ("activations",)


def removed_peak(live: np.ndarray, is_alloc: np.ndarray, end: np.ndarray, size: np.ndarray,
                 removed: np.ndarray) -> int:
    """The series' peak with the allocations at positions `removed` taken out over their lives."""
    delta = np.zeros(len(live), dtype=np.int64)
    sizes = np.asarray(size[removed], dtype=np.int64)
    np.add.at(delta, removed, sizes)
    ended = end[removed] < len(live)
    np.add.at(delta, end[removed][ended], -sizes[ended])
    return int((live - np.cumsum(delta)).max()) if len(live) else 0


def advise(peak: dict[str, Any], live: np.ndarray, pairs: Any, peak_position: int,
           category_of_live: Callable[[], tuple[np.ndarray, np.ndarray]], growing: list[dict[str, Any]],
           ooms: list[dict[str, Any]], step_starts: np.ndarray,
           every: Callable[[], tuple[np.ndarray, np.ndarray]]) -> list[dict[str, Any]]:
    """The rules' advice, largest saving first. `category_of_live()` gives the positions live at
    the peak and their category names' indexes (stowage.categories.CATEGORIES); `every()` every
    position's category and whether it was made under torch.optim; `step_starts` the positions
    where steps begin (none known: empty)."""
    from stowage.categories import CATEGORIES

    found: list[dict[str, Any]] = []
    total = max(int(peak["live_bytes"]), 1)
    live_at, category = category_of_live() if peak_position >= 0 else (np.zeros(0, dtype=np.int64), np.zeros(0))
    wasted = {name: int(peak.get("categories", {}).get(name, 0)) for name in CALLS}
    if any(waste >= MIN_SHARE * total for waste in wasted.values()):
        everything, optimizer = every()
    for name, call in CALLS.items():
        if wasted[name] < MIN_SHARE * total:
            continue
        removed = everything == CATEGORIES.index(name)
        if name == "optimizer states":
            removed |= optimizer & pairs.is_alloc  # the update's temporaries go to the host with it
        saving = total - removed_peak(live, pairs.is_alloc, pairs.end, pairs.size, np.flatnonzero(removed))
        bound = name in UPPER_BOUNDS
        found.append({"rule": name, "waste_bytes": wasted[name], "saving_bytes": saving, "upper_bound": bound,
                      "advice": f"{format_bytes(wasted[name])} of {name} live at the peak; {call}"
                                + (f" (saves at most {format_bytes(saving)}: backward brings them back a block at a "
                                   "time)" if bound else "")})
    gradients = live_at[category == CATEGORIES.index("gradients")]
    if len(step_starts) and len(gradients):
        step_of_peak = np.searchsorted(step_starts, peak_position, side="right")
        kept = gradients[np.searchsorted(step_starts, gradients, side="right") < step_of_peak]
        waste = int(np.asarray(pairs.size[kept], dtype=np.int64).sum())
        if waste >= MIN_SHARE * total:
            saving = total - removed_peak(live, pairs.is_alloc, pairs.end, pairs.size, kept)
            found.append({"rule": "gradients kept across steps", "waste_bytes": waste, "saving_bytes": saving,
                          "advice": f"{format_bytes(waste)} of gradients made in an earlier step are live at the peak: "
                                    "optimizer.zero_grad(set_to_none=True) after each step"})
    for row in growing[:1]:
        found.append({"rule": "memory growing every step", "waste_bytes": row["bytes_per_step"] * row["steps"],
                      "saving_bytes": row["bytes_per_step"] * row["steps"],
                      "advice": f"{row['site']} keeps {format_bytes(row['bytes_per_step'])} more after every step: "
                                "keep numbers, not tensors (loss.item()), or detach what is kept (tensor.detach())"})
    for oom in ooms[:1]:
        short = int(oom["requested"]) - int(oom["device_free"])
        cached = int(oom.get("cached_free", 0))
        if short > 0 and cached >= short:
            replayed = oom.get("stowage_peak_reserved")
            found.append({"rule": "out of memory with the bytes free in pieces", "waste_bytes": cached,
                          "saving_bytes": short,
                          "advice": f"the request was {format_bytes(short)} short of the device's free bytes while "
                                    f"the cache held {format_bytes(cached)} free in pieces: stowage's allocator "
                                    "(STOWAGE_ALLOC_CONF= or stowage.enable())" +
                                    (f", whose replay of this trace peaks at {format_bytes(replayed)} reserved"
                                     if replayed else "")})
    return sorted(found, key=lambda row: row["saving_bytes"], reverse=True)
