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
- made outside any module's forward: never freed, made before any backward, and in torch.nn (a
  module's __init__, ``.to()``): parameters (or buffers); else (the loop's own lines) inputs when
  it lives into backward or beyond, temporaries otherwise;
- on a GPU the backward runs on autograd's own thread, whose events have no Python frames: in a
  trace whose other events have them, an event without them is backward's;
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
PYTHON, OPTIMIZER, BACKWARD, MODULE, ZERO_GRAD, LIBRARY_NN = 1, 2, 4, 8, 16, 32


def stack_flags(frames: list[dict[str, Any]] | None) -> int:
    flags = 0
    for frame in frames or ():
        filename, name = str(frame.get("filename", "")), str(frame.get("name", ""))
        if not filename.endswith(".py"):
            continue
        flags |= PYTHON
        if "/torch/optim/" in filename:
            flags |= ZERO_GRAD if name == "zero_grad" else OPTIMIZER
        if name in ("backward", "grad") and ("/torch/_tensor.py" in filename or "/torch/autograd/" in filename):
            flags |= BACKWARD
        if name in ("_call_impl", "_wrapped_call_impl") and "/torch/nn/modules/module.py" in filename:
            flags |= MODULE
        if "/torch/nn/" in filename or "/transformers/modeling_utils.py" in filename:
            flags |= LIBRARY_NN
    return flags


def infer(columns: TraceColumns, index: np.ndarray, is_alloc: np.ndarray, end: np.ndarray,
          step_of: np.ndarray) -> np.ndarray:
    """The category of each LivePairs position (UNKNOWN at frees): `index`, `is_alloc` and `end`
    are LivePairs'; `step_of` the step each position falls in (one step where none are known)."""
    by_stack = np.array([stack_flags(stack) for stack in columns.stacks] + [0], dtype=np.int8)  # (six bits)
    stacks = columns.stack[index]
    flags = by_stack[np.where(stacks >= 0, stacks, len(columns.stacks))]
    n = len(index)
    if not n or np.mean(flags[is_alloc] & PYTHON != 0) < 0.1:  # no Python frames to read
        return np.full(n, UNKNOWN, dtype=np.int8)
    engine = (stacks >= 0) & (flags & PYTHON == 0)  # frames, none of them Python's: autograd's thread
    flags = np.where(engine, flags | PYTHON | BACKWARD, flags)
    freed = end < n
    free_flags = np.zeros(n, dtype=np.int8)
    free_flags[freed] = flags[end[freed]]
    # A free whose frames tell nothing of its own (none, or its allocation's: stowage records the
    # block's) is placed by where it falls: in backward between a step's first and last backward
    # allocation, after it otherwise.
    in_span = _backward_spans(is_alloc & (flags & BACKWARD != 0), step_of)
    blind = np.zeros(n, dtype=bool)
    blind[freed] = (stacks[end[freed]] < 0) | (stacks[end[freed]] == stacks[freed])
    placed = np.zeros(n, dtype=np.int8)
    placed[freed] = np.where(in_span[end[freed]], PYTHON | BACKWARD, PYTHON | ZERO_GRAD)
    free_flags = np.where(blind, placed, free_flags)
    later_step = np.zeros(n, dtype=bool)
    later_step[freed] = step_of[end[freed]] > step_of[freed]
    backwards = np.flatnonzero(is_alloc & (flags & BACKWARD != 0))
    first_backward = int(backwards[0]) if len(backwards) else n
    outlives = ~freed | later_step
    category = np.full(n, UNKNOWN, dtype=np.int8)
    alloc = is_alloc
    optimizer = alloc & (flags & OPTIMIZER != 0)
    backward = alloc & ~optimizer & (flags & BACKWARD != 0)
    forward = alloc & ~optimizer & ~backward
    in_module = forward & (flags & MODULE != 0)
    outside = forward & ~in_module
    kept_from_start = ~freed
    kept_from_start[first_backward:] = False
    module_made = flags & LIBRARY_NN != 0  # made in torch.nn (a module's __init__, .to(), ...): a parameter or buffer
    category[optimizer] = np.where(outlives[optimizer], STATES, TEMPORARIES)
    grad_kept = outlives | (free_flags & (OPTIMIZER | ZERO_GRAD) != 0) | (free_flags & BACKWARD == 0)
    category[backward] = np.where(grad_kept[backward], GRADIENTS, TEMPORARIES)
    freed_in_backward = freed & (free_flags & BACKWARD != 0)
    category[in_module] = np.where(kept_from_start[in_module], PARAMETERS,
                                   np.where(freed_in_backward[in_module], ACTIVATIONS,
                                            np.where(freed[in_module], TEMPORARIES, UNKNOWN)))
    lives_into_backward = freed_in_backward | (freed & (end > first_backward)) | ~freed
    category[outside] = np.where(kept_from_start[outside] & module_made[outside], PARAMETERS,
                                 np.where(lives_into_backward[outside], INPUTS, TEMPORARIES))
    return category


def _backward_spans(backward: np.ndarray, step_of: np.ndarray) -> np.ndarray:
    """Whether each position lies between its step's first and last backward allocation."""
    at = np.flatnonzero(backward)
    inside = np.zeros(len(backward), dtype=bool)
    if not len(at):
        return inside
    steps = step_of[at]
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    stops = np.r_[starts[1:], len(at)] - 1
    for first, last in zip(at[starts].tolist(), at[stops].tolist()):
        inside[first:last + 1] = True
    return inside


def live_by_category(category: np.ndarray, is_alloc: np.ndarray, end: np.ndarray, size: np.ndarray,
                     position: int) -> dict[str, int]:
    """Bytes live just after `position`, by category (the trace's own allocations)."""
    if position < 0:
        return {}
    head = slice(0, position + 1)
    live = np.flatnonzero(is_alloc[head] & (end[head] > position))
    totals = np.zeros(len(CATEGORIES), dtype=size.dtype)  # (Python ints where sums could pass int64)
    np.add.at(totals, category[live].astype(np.int64), size[live])
    return {name: int(total) for name, total in zip(CATEGORIES, totals.tolist()) if total}
