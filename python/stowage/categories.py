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

The rules run in C++ (snapshot/categories.hpp) over every position's stack flags, which this
module reads off each distinct stack's frames.

Contract: pure functions of a trace's columns and LivePairs; no state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stowage import _core
from stowage.snapshot_reader.columns import TraceColumns

CATEGORIES: tuple[str, ...] = _core.category_names
PARAMETERS, GRADIENTS, STATES, ACTIVATIONS, INPUTS, TEMPORARIES, UNKNOWN = range(len(CATEGORIES))

# Stack flags, from the frames of one stack.
PYTHON, OPTIMIZER, BACKWARD, MODULE, ZERO_GRAD, LIBRARY_NN, LOSS = (
    _core.stack_flag_bits[name] for name in ("PYTHON", "OPTIMIZER", "BACKWARD", "MODULE", "ZERO_GRAD", "LIBRARY_NN", "LOSS"))
_LOSS_NAMES = ("loss", "cross_entropy", "nll")  # a function computing a loss (in its name)


def stack_flags(frames: list[dict[str, Any]] | None) -> int:
    flags = 0
    in_module_call = False  # frames run innermost first: a loss's frame counts below any module call
    for frame in frames or ():
        filename, name = str(frame.get("filename", "")), str(frame.get("name", ""))
        in_module_call = in_module_call or name in ("_call_impl", "_wrapped_call_impl")
        if not in_module_call and any(word in name.lower() for word in _LOSS_NAMES):
            flags |= LOSS
        if not filename.endswith(".py"):
            continue
        flags |= PYTHON
        if "/torch/optim/" in filename:
            flags |= ZERO_GRAD if name == "zero_grad" else OPTIMIZER
        if name in ("backward", "grad") and ("/torch/_tensor.py" in filename or "/torch/autograd/" in filename):
            flags |= BACKWARD
        if name in ("_call_impl", "_wrapped_call_impl") and "/torch/nn/modules/module.py" in filename:
            flags |= MODULE
        if "/torch/nn/" in filename or "/transformers/modeling_utils.py" in filename or name == "__init__":
            flags |= LIBRARY_NN  # torch.nn, or a constructor (a module's __init__ making its weights)
    return flags


def position_flags(columns: TraceColumns, index: np.ndarray) -> np.ndarray:
    """The stack flags of every LivePairs position (int8)."""
    by_stack = np.array([stack_flags(stack) for stack in columns.stacks] + [0, 0], dtype=np.int8)
    return by_stack[columns.stack[index]]  # (-1 and -2, no frames: the two zeros at the end)


def trace_flags(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray) -> np.ndarray | None:
    """Every position's flags, autograd's thread's events marked backward's (an event with frames,
    none Python's, or an allocation with none at all: torch records an empty list there; a free
    without frames is placed by where it falls); None where the trace has no Python frames to read."""
    flags = position_flags(columns, index)
    return flags if _core.mark_autograd_thread(flags, columns.stack, index, is_alloc) else None


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
                    step_starts: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
    """The allocations live just after `position` (LivePairs positions) and their categories
    (only those are categorised)."""
    live = live_positions(is_alloc, end, position)
    return live, infer(columns, index, is_alloc, end, step_starts, live)


CHUNK = 1 << 20  # positions categorised at once (what a whole trace's categories cost is held to)


def all_categories(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray, end: np.ndarray,
                   step_starts: np.ndarray, flags: np.ndarray | None = None) -> np.ndarray:
    """Every allocation's category (int8 by LivePairs position; UNKNOWN at frees), worked out a
    CHUNK of allocations at a time; `flags`: trace_flags' (worked out here when not given)."""
    out = np.full(len(index), UNKNOWN, dtype=np.int8)
    flags = trace_flags(columns, index, is_alloc) if flags is None else flags  # once, for every chunk
    if flags is None:
        return out
    allocs = np.flatnonzero(is_alloc)
    for start in range(0, len(allocs), CHUNK):
        chunk = allocs[start:start + CHUNK]
        out[chunk] = infer(columns, index, is_alloc, end, step_starts, chunk, flags)
    return out


def totals(live: np.ndarray, category: np.ndarray, size: np.ndarray) -> dict[str, int]:
    """Bytes of the allocations `live` by category."""
    summed = np.zeros(len(CATEGORIES), dtype=size.dtype)  # (Python ints where sums could pass int64)
    np.add.at(summed, category.astype(np.int64), size[live])
    return {name: int(total) for name, total in zip(CATEGORIES, summed.tolist()) if total}


def kept_without_backward(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray, end: np.ndarray,
                          flags: np.ndarray | None, saved: np.ndarray | None = None) -> np.ndarray:
    """The allocations a module's forward made that outlived it (the loop's own code allocated
    while they lived) with no backward between their allocation and their free: a graph autograd
    kept for a backward that never came (evaluation without no_grad). `saved`: where the snapshot
    says which allocations autograd saved (stowage's tags), only those; otherwise, as outputs
    alone also outlive a forward, only when they come from at least three allocating lines.
    `flags`: trace_flags' (None: a trace without Python frames, where nothing is found)."""
    if flags is None:
        return np.zeros(0, dtype=np.int64)
    return _core.kept_without_backward(flags, columns.stack, index, is_alloc, end, saved)


def loss_allocations(is_alloc: np.ndarray, flags: np.ndarray | None) -> np.ndarray:
    """The positions of the allocations a loss function made in forward (a function named for a
    loss, called inside the innermost module's forward or outside any); `flags`: trace_flags'."""
    if flags is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(is_alloc & (flags & LOSS != 0) & (flags & (BACKWARD | OPTIMIZER) == 0))


def backward_allocations(is_alloc: np.ndarray, flags: np.ndarray | None) -> np.ndarray:
    """The positions of backward's allocations (autograd's thread's on a GPU), in order; none in a
    trace without Python frames (`flags`: trace_flags')."""
    return np.zeros(0, dtype=np.int64) if flags is None else np.flatnonzero(is_alloc & (flags & BACKWARD != 0))


def freed_in_backward(backwards: np.ndarray, end: np.ndarray, step_starts: np.ndarray,
                      positions: np.ndarray) -> np.ndarray:
    """Whether each allocation at `positions` is freed in a backward (between a step's first and
    last backward allocation; `backwards`: backward_allocations')."""
    return _core.freed_in_backward(backwards, end, step_starts, positions)
