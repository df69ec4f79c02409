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

Contract: pure functions of a trace's columns and LivePairs; no state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stowage.snapshot_reader.columns import TraceColumns

CATEGORIES = ("parameters", "gradients", "optimizer states", "activations", "inputs", "temporaries", "unknown")
PARAMETERS, GRADIENTS, STATES, ACTIVATIONS, INPUTS, TEMPORARIES, UNKNOWN = range(len(CATEGORIES))

# Stack flags, from the frames of one stack.
PYTHON, OPTIMIZER, BACKWARD, MODULE, ZERO_GRAD, LIBRARY_NN, LOSS = 1, 2, 4, 8, 16, 32, 64
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
    """Every position's flags, autograd's thread's events marked backward's; None where the trace
    has no Python frames to read."""
    flags = position_flags(columns, index)
    if not len(index) or np.count_nonzero(flags[is_alloc] & PYTHON) < 0.1 * max(np.count_nonzero(is_alloc), 1):
        return None
    stack = columns.stack[index]
    # Autograd's thread: an event with frames, none Python's (C++ stacks recorded), or an
    # allocation with none at all (torch records an empty list there). A free without frames is
    # placed by where it falls (infer).
    engine = ((stack >= 0) | ((stack == -1) & is_alloc)) & (flags & PYTHON == 0)
    flags[engine] |= PYTHON | BACKWARD
    return flags


def infer(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray, end: np.ndarray,
          step_starts: np.ndarray, positions: np.ndarray, flags: np.ndarray | None = None) -> np.ndarray:
    """The category of the allocations at LivePairs `positions`: `index`, `is_alloc` and `end`
    are LivePairs'; `step_starts` the positions where steps begin (empty: one step); `flags`
    trace_flags' (worked out here when not given)."""
    n = len(index)
    flags = trace_flags(columns, index, is_alloc) if flags is None else flags
    if flags is None:
        return np.full(len(positions), UNKNOWN, dtype=np.int8)  # no Python frames to read
    stacks = columns.stack[index]
    backwards = np.flatnonzero(is_alloc & (flags & BACKWARD != 0))
    first_backward = int(backwards[0]) if len(backwards) else n
    spans = _backward_spans(backwards, step_starts)
    own, ends = flags[positions], end[positions]
    freed = ends < n
    ended = ends[freed]
    free_flags = np.zeros(len(positions), dtype=np.int8)
    free_flags[freed] = flags[ended]
    # A free whose frames tell nothing of its own (none, or its allocation's: stowage records the
    # block's) is placed by where it falls: in backward between a step's first and last backward
    # allocation, after it otherwise.
    blind = np.zeros(len(positions), dtype=bool)
    blind[freed] = (stacks[ended] < 0) | (stacks[ended] == stacks[positions[freed]])
    placed = np.zeros(len(positions), dtype=np.int8)
    placed[freed] = np.where(_inside(spans, ended), PYTHON | BACKWARD, PYTHON | ZERO_GRAD)
    free_flags = np.where(blind, placed, free_flags)
    later_step = np.zeros(len(positions), dtype=bool)
    later_step[freed] = np.searchsorted(step_starts, ended, side="right") > \
        np.searchsorted(step_starts, positions[freed], side="right")
    last_backward = int(backwards[-1]) if len(backwards) else n
    return _rules(own, free_flags, freed, later_step, positions < first_backward, ends > first_backward,
                  ends > last_backward)


def _rules(own: np.ndarray, free_flags: np.ndarray, freed: np.ndarray, later_step: np.ndarray,
           before_backward: np.ndarray, ends_after_backward: np.ndarray, ends_after_last_backward: np.ndarray) -> np.ndarray:
    """The module's rules (its docstring), on allocations' flags and their frees'."""
    outlives = ~freed | later_step
    category = np.full(len(own), UNKNOWN, dtype=np.int8)
    optimizer = own & OPTIMIZER != 0
    backward = ~optimizer & (own & BACKWARD != 0)
    forward = ~optimizer & ~backward
    in_module = forward & (own & MODULE != 0)
    outside = forward & ~in_module
    kept_from_start = ~freed & before_backward
    module_made = own & LIBRARY_NN != 0  # made in torch.nn (a module's __init__, .to(), ...): a parameter or buffer
    category[optimizer] = np.where(outlives[optimizer], STATES, TEMPORARIES)
    grad_kept = outlives | (free_flags & (OPTIMIZER | ZERO_GRAD) != 0) | (free_flags & BACKWARD == 0)
    category[backward] = np.where(grad_kept[backward], GRADIENTS, TEMPORARIES)
    freed_in_backward = freed & (free_flags & BACKWARD != 0)
    category[in_module] = np.where(kept_from_start[in_module], PARAMETERS,
                                   np.where(freed_in_backward[in_module], ACTIVATIONS,
                                            np.where(freed[in_module], TEMPORARIES, UNKNOWN)))
    lives_into_backward = freed_in_backward | (freed & ends_after_backward) | ~freed
    # (a model's weights may be freed when the run ends, after its last backward)
    held_through = before_backward & (~freed | ends_after_last_backward)
    category[outside] = np.where(held_through[outside] & module_made[outside], PARAMETERS,
                                 np.where(lives_into_backward[outside], INPUTS, TEMPORARIES))
    return category


def _backward_spans(backwards: np.ndarray, step_starts: np.ndarray) -> np.ndarray:
    """[first, last] backward allocation of each step, as rows (positions)."""
    if not len(backwards):
        return np.zeros((0, 2), dtype=np.int64)
    steps = np.searchsorted(step_starts, backwards, side="right")
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    stops = np.r_[starts[1:], len(backwards)] - 1
    return np.stack([backwards[starts], backwards[stops]], axis=1)


def _inside(spans: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Whether each position lies in one of the (sorted, disjoint) spans."""
    if not len(spans):
        return np.zeros(len(positions), dtype=bool)
    row = np.searchsorted(spans[:, 0], positions, side="right") - 1
    return (row >= 0) & (positions <= spans[np.maximum(row, 0), 1])


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
    made_in = is_alloc & (flags & MODULE != 0) & (flags & (BACKWARD | OPTIMIZER) == 0)
    candidates = np.flatnonzero(made_in if saved is None else made_in & saved)
    backwards = np.flatnonzero(is_alloc & (flags & BACKWARD != 0))
    loop = np.flatnonzero(is_alloc & (flags & PYTHON != 0) & (flags & (MODULE | BACKWARD | OPTIMIZER) == 0))
    ends = end[candidates]
    no_backward = np.searchsorted(backwards, candidates, side="right") == np.searchsorted(backwards, ends)
    outlived = np.searchsorted(loop, candidates, side="right") < np.searchsorted(loop, ends)
    kept = candidates[no_backward & outlived]
    if saved is None and len(np.unique(columns.stack[index[kept]])) < 3:
        return np.zeros(0, dtype=np.int64)
    return kept


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
    spans = _backward_spans(backwards, step_starts)
    ends = end[positions]
    return (ends < len(end)) & _inside(spans, np.minimum(ends, len(end) - 1))
