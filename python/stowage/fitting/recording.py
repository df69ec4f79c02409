"""`fit`'s recording of the step: whole at the example when it fits and is not to be cut; at 2 and 3
rows when it may be cut (every cut's trace read off the rows' line); else at the first smaller grid
(`profiling_grids`) it fits and runs the same ops at, evaluated at the example's (stowage.plan.sizes);
then the step run plainly at a recorded point, its ops' times scaled to it (Note [Calibrated
compute] in planner/step_traces.hpp).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch

import stowage.plan
from stowage import _core
from stowage import memory as stowage_memory
from stowage._core import MIN_ROWS
from stowage.fitting.batches import ExampleBatch, LossFn, LossFnNeeded, profiling_grids, shown
from stowage.fitting.choosing import StepTraces
from stowage.fitting.side_effects import fit_trial, untouched
from stowage.offload.sharded import local
from stowage.plan.calibration import best_seconds
from stowage.plan.sizes import StepsDiffer, grid_points

MICRO_GRID = (MIN_ROWS, MIN_ROWS + 1)  # rows a step that may be cut is recorded at
CALIBRATION_RUNS = 3  # plain steps timed once the step is recorded, their median taken


class CannotCut(Exception):
    """The step cannot be planned per micro-batch (the reason); fit keeps the batch whole."""


Profiled = tuple[StepTraces, str]  # a micro-batch's lifetime trace by its rows, and how it was recorded


def _profile(model: Any, loss_fn: LossFn, example: ExampleBatch, device: torch.device, capacity: int,
             cost: dict[str, float] | None) -> Profiled:
    """The step's lifetime trace (see the module's contract), and how it was recorded."""
    def step(at: Any) -> None:  # gradients made and let go, as a step then the optimizer's zero_grad do
        loss_fn(model, at).backward()
        model.zero_grad(set_to_none=True)

    kind = "cuda" if device.type == "cuda" else "cpu"
    full = example.layout.sizes
    try:
        if example.units is None:
            trace = stowage.plan.profile(lambda: step(example.batch), device=kind, cost=cost, model=model)
            return _calibrated(StepTraces.whole(trace), trace, lambda: step(example.batch), device), \
                f"step recorded at {shown(full)}"
        try:
            sized = stowage.plan.profile(_on_cuts(step, example, {"batch": MICRO_GRID}), sizes={"batch": MICRO_GRID},
                                         device=kind, cost=cost, model=model)
        except ValueError as error:  # the step's ops differ between 2 and 3 rows, or it refuses so few
            model.zero_grad(set_to_none=True)
            why = "its ops differ with the rows" if isinstance(error, StepsDiffer) else "it fails on 2 or 3 rows"
            raise CannotCut(f"{why} ({str(error).splitlines()[0]})") from None
        rest = f" x seq {example.layout.seq}" if example.layout.seq is not None else ""
        return _calibrated_sized(StepTraces.by_rows(sized, {}), sized, step, example, device), (
            f"step recorded at batch {{{', '.join(map(str, MICRO_GRID))}}}{rest}, planned per micro-batch")
    except torch.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
    sized, grid_shown, failures = _record_smaller(step, example, kind, cost, model)
    if sized is None:
        model.zero_grad(set_to_none=True)
        if not all(isinstance(error, torch.OutOfMemoryError) for _, error in failures):
            raise ValueError(_core.unrecordable_message(list(full.items()), [(g, _first_line(e)) for g, e in failures],
                                                        any(isinstance(e, StepsDiffer) for _, e in failures)))
        smallest = [(name, values[0]) for name, values in profiling_grids(example.layout)[-1].items()]
        gradients = sum(local(p).numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        raise torch.OutOfMemoryError(_core.too_large_message(
            smallest, stowage_memory.memory_allocated(device), capacity, gradients, _first_line(failures[-1][1])))
    grid = sized.sizes
    if example.units is not None:
        traces = StepTraces.by_rows(sized, {name: full[name] for name in grid})
        return _calibrated_sized(traces, sized, step, example, device), (
            f"step does not fit at 2 rows: recorded at {grid_shown}, planned per micro-batch")
    trace = sized.at({name: full[name] for name in grid})
    return _calibrated_sized(StepTraces.whole(trace), sized, step, example, device), (
        f"step does not fit whole: recorded at {grid_shown}, planned at {shown(full)}")


def _calibrated(traces: StepTraces, recorded: Any, run: Callable[[], None], device: torch.device) -> StepTraces:
    """`traces` with their ops' times scaled so that `recorded` (a LifetimeTrace of them) takes what
    `run`, the step it recorded, takes run plainly (Note [Calibrated compute] in
    planner/step_traces.hpp): the median of CALIBRATION_RUNS runs (fit predicts a typical step)."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    plain_ms = statistics.median(best_seconds(run, synchronize, repeats=1) for _ in range(CALIBRATION_RUNS)) * 1e3
    if recorded.compute_ms <= 0 or plain_ms <= 0:
        return traces
    return StepTraces(traces.native.with_compute_scale(plain_ms / recorded.compute_ms), traces.regions)


def _calibrated_sized(traces: StepTraces, sized: Any, step: Callable[[Any], None], example: ExampleBatch,
                      device: torch.device) -> StepTraces:
    """`traces`, read off `sized` (a SizedTrace), calibrated at the grid's first point."""
    piece = example.layout.at(example.batch, grid_points(sized.sizes)[0])  # cut before the runs are timed
    return _calibrated(traces, sized.traces[0], lambda: step(piece), device)


def _on_cuts(step: Callable[[Any], None], example: ExampleBatch,
             grid: dict[str, tuple[int, ...]]) -> Callable[..., None]:
    """`step` on the example cut to each point of `grid`, cut before anything is recorded: cutting
    is no part of the step (its copies and ops would count, and differ by point: a full-length
    index is an alias where a shorter one is a slice)."""
    pieces = {tuple(point.items()): example.layout.at(example.batch, point) for point in grid_points(grid)}
    return lambda **sizes: step(pieces[tuple(sizes.items())])


Failures = list[tuple[str, Exception]]  # each grid tried (as shown) and why it could not be recorded there


def _record_smaller(step: Callable[[Any], None], example: ExampleBatch, kind: str, cost: dict[str, float] | None,
                    model: Any) -> tuple[Any, str, Failures]:
    """The step recorded at the first of profiling_grids that it fits and runs the same ops at (the
    sized trace, the grid shown, the grids tried before), or (None, "", every grid tried and why).
    A failed recording leaves the device as it found it, so each grid has the first's room."""
    failures: Failures = []
    for grid in profiling_grids(example.layout):
        grid_shown = " x ".join(f"{name} {{{', '.join(map(str, values))}}}" for name, values in grid.items())
        try:
            sized = stowage.plan.profile(_on_cuts(step, example, grid), sizes=grid, device=kind, cost=cost,
                                         model=model)
            return sized, grid_shown, failures
        except LossFnNeeded:
            model.zero_grad(set_to_none=True)
            raise
        except (torch.OutOfMemoryError, RuntimeError, ValueError, TypeError, IndexError) as error:
            failures.append((grid_shown, error))
        model.zero_grad(set_to_none=True)
    return None, "", failures


def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def record(model: Any, loss_fn: LossFn, example: ExampleBatch, device: torch.device, capacity: int,
           cost: dict[str, float] | None, micro_batches: int | str) -> tuple[StepTraces, str, ExampleBatch]:
    """The step recorded as one of fit's trials; one that cannot be planned per micro-batch runs
    whole under micro_batches="auto" (a count asked for is refused)."""
    try:
        with fit_trial(device), untouched(model, device):
            return (*_profile(model, loss_fn, example, device, capacity, cost), example)
    except CannotCut as error:
        if micro_batches != "auto":
            raise ValueError(f"stowage.fit: micro_batches={micro_batches} cannot be planned: {error}") from None
        example = example.whole(str(error))
        with fit_trial(device), untouched(model, device):
            return (*_profile(model, loss_fn, example, device, capacity, cost), example)
