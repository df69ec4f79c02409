"""fit's plan tried once before training: the chosen plan runs one step (one micro-batch) and
its measured peak is held to the plan's prediction, so a step the planner's model does not
capture is caught before training instead of out of memory in it.

Two things a recording cannot show are caught this way: a step that adds more at its peak than
the plan predicts (the overshoot becomes a reserve every option is weighed with again), and a
block whose forward runs other ops when recomputed (a kernel chosen differently in backward,
state cached by its first call): every block of its kind (its path with the list indices taken
out) is then left out of recomputation (`without_recompute`), and the choice is made again.

Contract: the caller restores what the step changes (stowage.fitting.side_effects.untouched);
one trial at a time, on the thread that trains.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import torch

from stowage import memory
from stowage.fitting.batches import LossFn
from stowage.plan import LifetimeTrace, Plan
from stowage.plan.applying import recompute_unannounced

RECOMPUTE_FAILURE = re.compile(r"stowage\.plan: block '([^']*)' ran .* when recomputed")


@dataclass(frozen=True)
class Outcome:
    """What one trial found: the bytes the step added beyond the prediction (0 where it held),
    and the block kind whose recompute failed ("" where none did)."""

    overshoot: int
    failed_block_kind: str


def block_kind(path: str) -> str:
    """A block's path with its list indices wild: "model.layers.5" -> "model.layers.*"."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", path)


OUT_OF_MEMORY_OVERSHOOT = 16 << 20  # taken for a tried step that ran out of memory (at least; fit's margin)


def run_once(model: Any, loss_fn: LossFn, piece: Any, plan: Plan, device: torch.device) -> Outcome:
    """One forward and backward of `piece` under `plan`, its added peak against the prediction."""
    model.zero_grad(set_to_none=True)
    start = memory.memory_allocated(device)
    memory.reset_peak_stats(device)
    floor = 0
    try:
        with recompute_unannounced(), plan:  # (training's plan says it recomputes, if it does)
            loss_fn(model, piece).backward()
    except torch.OutOfMemoryError:
        floor = OUT_OF_MEMORY_OVERSHOOT
    except RuntimeError as error:
        found = RECOMPUTE_FAILURE.search(str(error))
        if found is None:
            raise
        return Outcome(0, block_kind(found.group(1)))
    finally:
        model.zero_grad(set_to_none=True)
    added = memory.max_memory_allocated(device) - start
    return Outcome(max(added - plan.predicted_peak_bytes, floor), "")


def regions_of_kinds(regions: list[Any], kinds: set[str]) -> frozenset[int]:
    """The checkpoint regions (their indices) whose blocks are of `kinds`."""
    return frozenset(index for index, region in enumerate(regions) if block_kind(region.module) in kinds)


def without_recompute(trace: LifetimeTrace, excluded: frozenset[int]) -> LifetimeTrace:
    """`trace` with the blocks of the `excluded` regions not recomputable (their tensors kept or offloaded)."""
    if not excluded:
        return trace
    trace, tensors, regions = copy.copy(trace), trace.tensors, trace.regions  # (the lists are copies)
    for tensor in tensors:
        tensor.recomputable = tensor.recomputable and tensor.region not in excluded
    for index in excluded:
        regions[index].checkpointable = False
    trace.tensors, trace.regions = tensors, regions
    return trace
