"""What each allocation of a trace is, inferred from its stacks and lifetime, as stock PyTorch's
snapshots allow: parameters, gradients, optimizer states, activations, inputs, temporaries, or
unknown.

The rules read the Python frames of the allocation and of the free that ends it (torch records
both), and whether it outlives its step:
- made under torch.optim (its frames pass through torch/optim/): optimizer states when it
  outlives the optimizer's step (never freed, or freed in a later step), else temporaries;
- made in backward (a frame of Tensor.backward or torch.autograd.backward/grad): gradients when
  it outlives backward (freed by the optimizer, zero_grad, or not at all), else temporaries;
- made outside both, inside a module's forward (a frame of nn.Module's call): activations when
  backward frees it, temporaries when the forward does; one never freed, made before any
  backward, is a parameter (or buffer);
- made outside any module's forward: made before any backward and freed after the last (or
  never), in torch.nn or a constructor (a module's __init__, ``.to()``): parameters (or
  buffers); else (the loop's own lines) inputs when
  it lives into backward or beyond, temporaries otherwise;
- on a GPU the backward runs on autograd's own thread, whose events have no Python frames: in a
  trace whose other events have them, an allocation without them is backward's, and a free
  without them is placed by where it falls (in backward between a step's first and last
  backward allocation);
- in a trace without Python frames at all: unknown.

The rules run in C++ (snapshot/categories.hpp) over every position's stack flags, read there
off each distinct stack's frames.

Contract: pure functions of a trace's columns and LivePairs; no state.
"""

from __future__ import annotations

import numpy as np

from stowage import _core
from stowage.snapshot_reader.columns import TraceColumns

CATEGORIES: tuple[str, ...] = _core.category_names
PARAMETERS, GRADIENTS, STATES, ACTIVATIONS, INPUTS, TEMPORARIES, UNKNOWN = range(len(CATEGORIES))

def position_flags(columns: TraceColumns, index: np.ndarray) -> np.ndarray:
    """The stack flags of every LivePairs position (int8; each stack's read off its frames:
    snapshot/categories.hpp's stack_flags)."""
    by_stack = np.append(_core.stack_flags(columns.stacks), np.zeros(2, dtype=np.int8))
    return by_stack[columns.stack[index]]  # (-1 and -2, no frames: the two zeros at the end)


def both_flags(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """position_flags, and trace_flags made from them (each stack's frames read once)."""
    flags = position_flags(columns, index)
    marked = flags.copy()
    return flags, marked if _core.mark_autograd_thread(marked, columns.stack, index, is_alloc) else None


def trace_flags(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray) -> np.ndarray | None:
    """Every position's flags, autograd's thread's events marked backward's (an event with frames,
    none Python's, or an allocation with none at all: torch records an empty list there; a free
    without frames is placed by where it falls); None where the trace has no Python frames to read."""
    return both_flags(columns, index, is_alloc)[1]


def infer(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray, end: np.ndarray,
          step_starts: np.ndarray, positions: np.ndarray, flags: np.ndarray | None = None) -> np.ndarray:
    """The category of the allocations at LivePairs `positions`: `index`, `is_alloc` and `end`
    are LivePairs'; `step_starts` the positions where steps begin (empty: one step); `flags`
    trace_flags' (worked out here when not given)."""
    flags = trace_flags(columns, index, is_alloc) if flags is None else flags
    if flags is None:
        return np.full(len(positions), UNKNOWN, dtype=np.int8)  # no Python frames to read
    return _core.infer_categories(flags, columns.stack, index, is_alloc, end, step_starts, positions)


def live_positions(is_alloc: np.ndarray, end: np.ndarray, position: int) -> np.ndarray:
    """The allocations live just after `position` (LivePairs positions; none before the first)."""
    if position < 0:
        return np.zeros(0, dtype=np.int64)
    head = slice(0, position + 1)
    return np.flatnonzero(is_alloc[head] & (end[head] > position))


def live_categories(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray, end: np.ndarray,
                    step_starts: np.ndarray, position: int,
                    flags: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The allocations live just after `position` (LivePairs positions) and their categories
    (only those are categorised); `flags`: trace_flags' (worked out here when not given)."""
    live = live_positions(is_alloc, end, position)
    return live, infer(columns, index, is_alloc, end, step_starts, live, flags)


def all_categories(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray, end: np.ndarray,
                   step_starts: np.ndarray, flags: np.ndarray | None = None) -> np.ndarray:
    """Every allocation's category (int8 by LivePairs position; UNKNOWN at frees; C++:
    snapshot/advice_evidence.hpp); `flags`: trace_flags' (worked out here when not given)."""
    flags = trace_flags(columns, index, is_alloc) if flags is None else flags
    if flags is None:
        return np.full(len(index), UNKNOWN, dtype=np.int8)
    return _core.all_categories(flags, columns.stack, index, is_alloc, end, step_starts)


def totals(live: np.ndarray, category: np.ndarray, size: np.ndarray) -> dict[str, int]:
    """Bytes of the allocations `live` by category."""
    summed = np.zeros(len(CATEGORIES), dtype=size.dtype)  # (Python ints where sums could pass int64)
    np.add.at(summed, category.astype(np.int64), size[live])
    return {name: int(total) for name, total in zip(CATEGORIES, summed.tolist()) if total}
