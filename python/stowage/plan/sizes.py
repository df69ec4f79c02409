"""A step recorded at a grid of sizes (batch, sequence length, ...), so that one recording serves
steps of any size and a model that does not fit at the size it trains at is profiled at sizes
that do (README, "Planning keep / offload / recompute"). The planner evaluates it at any sizes
(Note [Sized traces] in planner/sized_trace.hpp); this module checks the grid's steps are one
step: the same ops, saved tensors and checkpoint regions at every point, else StepsDiffer naming
the first difference and the sizes between which it lies.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Mapping, Sequence

from stowage import _core
from stowage.plan.file_formats import (MAX_GRID_POINTS, MAX_POINTS, MAX_SIZE_VALUE, MAX_SIZES, SIZED, VERSION,
                                       load_trace_document, planner_message, save_document)
from stowage.validation import InputError, read_json


def grid_points(sizes: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """The grid's points in the order a SizedTrace keeps its traces; ValueError for sizes
    that cannot make one, or a grid larger than MAX_GRID_POINTS (counted before it is built)."""
    if not sizes:
        raise ValueError("sizes needs at least one size, e.g. {'batch': (2, 4)}")
    if len(sizes) > MAX_SIZES:
        raise ValueError(f"{len(sizes)} sizes is above {MAX_SIZES}")
    count = 1
    for name, points in sizes.items():
        values = list(points)[:MAX_POINTS + 1]
        if len(values) < 2 or len(set(values)) != len(values) or any(int(v) <= 0 for v in values):
            raise ValueError(f"size {name!r}: give two or more distinct positive points, not {values!r}")
        if len(values) > MAX_POINTS or any(int(v) > MAX_SIZE_VALUE for v in values):
            raise ValueError(f"size {name!r}: at most {MAX_POINTS} points, each at most {MAX_SIZE_VALUE:,}")
        count *= len(values)
    if count > MAX_GRID_POINTS:
        raise ValueError(f"a grid of {count:,} points is above {MAX_GRID_POINTS}")
    names = list(sizes)
    return [dict(zip(names, (int(v) for v in point))) for point in itertools.product(*sizes.values())]


class StepsDiffer(ValueError):
    """The grid's steps are not one step: their ops, saved tensors or checkpoint regions differ
    (the message names the first difference and the sizes it lies between)."""


class SizedTrace:
    """A sized trace: one step's lifetime traces at each point of a grid of sizes (``traces[i]``
    recorded at ``grid_points(sizes)[i]``), all of one structure (checked on construction); ``at``
    evaluates them at any sizes (``native``: the planner's stowage._core.SizedTrace). Immutable."""

    def __init__(self, sizes: dict[str, list[int]], traces: list[Any]) -> None:
        points = grid_points(sizes)
        if len(points) != len(traces):
            raise ValueError(f"a grid of {len(points)} points needs as many lifetime traces, not {len(traces)}")
        for point, trace in zip(points[1:], traces[1:]):
            difference = _core.step_difference(traces[0], trace, _describe(points[0]), _describe(point))
            if difference is not None:
                raise StepsDiffer(difference)
        self.sizes, self.traces = sizes, traces
        self.native = _core.SizedTrace(list(sizes.items()), traces)

    def at(self, sizes: Mapping[str, int]) -> Any:
        """The step's lifetime trace at `sizes` (every size of the grid, by name)."""
        missing = set(self.sizes) - set(sizes)
        unknown = set(sizes) - set(self.sizes)
        if missing or unknown:
            raise ValueError(f"the trace was recorded at sizes {sorted(self.sizes)}; got {sorted(sizes)}")
        if any(type(value) is not int or not 0 < value <= MAX_SIZE_VALUE for value in sizes.values()):
            raise ValueError(f"sizes must be integers from 1 to {MAX_SIZE_VALUE:,}: {dict(sizes)}")
        try:
            return self.native.at([sizes[name] for name in self.sizes])
        except ValueError as error:
            raise ValueError(planner_message(error)) from None

    def document(self) -> dict[str, Any]:
        return {"format": SIZED, "version": VERSION, "sizes": self.sizes,
                "profiles": [trace.document() for trace in self.traces]}

    def save(self, path: str | Path) -> None:
        save_document(self.document(), path)


def _describe(point: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in point.items())


def load_trace(path: str | Path) -> Any:
    """Reads a lifetime trace file: a LifetimeTrace, or a SizedTrace for a step recorded at
    several sizes; InputError (a ValueError) naming what is wrong with a file that is neither,
    within the bounds of stowage.validation, or the first way a sized trace's grid's steps differ."""
    document = read_json(path, "a stowage lifetime trace")
    if not (isinstance(document, dict) and document.get("format") == SIZED):
        return load_trace_document(document, str(path))
    traces = _core.read_plan_file(document, str(path), SIZED)  # its lifetime traces too ("profiles[3]")
    try:
        return SizedTrace({name: list(points) for name, points in document["sizes"].items()}, traces)
    except ValueError as error:
        raise InputError(str(path), "profiles", str(error)) from None
