"""The peak a trace would have with one of its wastes fixed, worked out by changing the lives of
some allocations and summing the live bytes again:
- `removed_peak`: the allocations gone over their whole lives (moved to the host, never made);
- `freed_when_made_peak`: allocations kept across steps freed as soon as they are made (what is
  kept is detached, or a number: the graph behind it goes when the forward that made it ends);
- `grads_set_to_none_peak`: gradients kept across steps (zero_grad(set_to_none=False)) freed at
  each step's end and made again in the next backward. Kept, backward adds each step's gradient
  into them in place and frees it; set to None, that gradient becomes the parameter's .grad and
  lives to the step's end. It is found in each later step as the allocation at the same place in
  the step's backward as the kept gradient's was in its own (the steps run the same ops).

Contract: pure functions of the live-bytes series and LivePairs' arrays.
"""

from __future__ import annotations

import numpy as np


def changed_peak(live: np.ndarray, change: np.ndarray) -> int:
    """The series' peak with `change` (per position) added to its running sum."""
    return int((live + np.cumsum(change)).max()) if len(live) else 0


def removed_peak(live: np.ndarray, end: np.ndarray, size: np.ndarray, removed: np.ndarray) -> int:
    """The series' peak with the allocations at positions `removed` taken out over their lives."""
    change = np.zeros(len(live), dtype=np.int64)
    sizes = np.asarray(size[removed], dtype=np.int64)
    np.add.at(change, removed, -sizes)
    ended = end[removed] < len(live)
    np.add.at(change, end[removed][ended], sizes[ended])
    return changed_peak(live, change)


def _step_end(step_starts: np.ndarray, positions: np.ndarray, n: int) -> np.ndarray:
    """The position where each position's step ends (the next step's start; n for the last)."""
    following = np.searchsorted(step_starts, positions, side="right")
    return np.where(following < len(step_starts), step_starts[np.minimum(following, len(step_starts) - 1)], n)


def freed_when_made_peak(live: np.ndarray, end: np.ndarray, size: np.ndarray, kept: np.ndarray,
                         backward_allocs: np.ndarray, step_starts: np.ndarray) -> int:
    """The series' peak with the allocations `kept` (sorted positions) freed as soon as the group
    they were made in is made: groups are split by backward's allocations (what one forward kept
    has none between its allocations); where none splits them, at their step's end."""
    n = len(live)
    change = np.zeros(n + 1, dtype=np.int64)
    sizes = np.asarray(size[kept], dtype=np.int64)
    group = np.searchsorted(backward_allocs, kept)
    if len(kept) and group[0] != group[-1]:
        last = np.flatnonzero(np.r_[group[1:] != group[:-1], True])  # each group's last member
        early = kept[last][np.searchsorted(last, np.arange(len(kept)))] + 1
    else:
        early = _step_end(step_starts, kept, n)
    early = np.minimum(early, end[kept])
    np.add.at(change, early, -sizes)
    np.add.at(change, end[kept], sizes)
    return changed_peak(live, change[:n])


def grads_set_to_none_peak(live: np.ndarray, is_alloc: np.ndarray, end: np.ndarray, size: np.ndarray,
                           kept: np.ndarray, backward_allocs: np.ndarray, step_starts: np.ndarray) -> int:
    """The series' peak with the gradients `kept` (allocated in backward, kept across steps) set
    to None at each step's end (module docstring); `backward_allocs`: positions of backward's
    allocations, in order."""
    n = len(live)
    change = np.zeros(n + 1, dtype=np.int64)
    sizes = np.asarray(size[kept], dtype=np.int64)
    own_end = np.minimum(_step_end(step_starts, kept, n), end[kept])
    np.add.at(change, own_end, -sizes)  # the kept gradients, gone when their own step ends ...
    np.add.at(change, end[kept], sizes)
    step_of_backward = np.searchsorted(step_starts, backward_allocs, side="right")
    first = np.searchsorted(step_of_backward, np.arange(len(step_starts) + 1))  # each step's first backward alloc
    counts = np.diff(np.r_[first, len(backward_allocs)])
    allocs = np.flatnonzero(is_alloc)
    rank = np.searchsorted(allocs, np.arange(n))  # allocation ordinal of each position
    for g, s in zip(kept.tolist(), np.asarray(size[kept], dtype=np.int64).tolist()):
        own_step = int(np.searchsorted(step_starts, g, side="right"))
        if counts[own_step] == 0:
            continue
        ordinal = int(rank[g] - rank[backward_allocs[first[own_step]]])
        if ordinal < 0:  # (made before its step's backward: nothing to find it by)
            continue
        last_step = int(np.searchsorted(step_starts, min(int(end[g]), n - 1), side="right"))
        for step in range(own_step + 1, last_step + 1):
            if counts[step] == 0:
                continue
            at = rank[backward_allocs[first[step]]] + ordinal
            if at >= len(allocs):
                break
            t = int(allocs[at])
            step_end = int(_step_end(step_starts, np.array([t]), n)[0])
            if int(size[t]) != s or end[t] >= step_end:
                continue
            change[end[t]] += s  # ... and each step's own gradient kept to the step's end
            change[step_end] -= s
    return changed_peak(live, change[:n])
