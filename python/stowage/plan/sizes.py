"""A step recorded at a grid of sizes (batch, sequence length, ...): every byte count and time of
its lifetime trace as a polynomial in the sizes, so one recording serves steps of any size, and a
model that does not fit at the size it trains at is profiled at sizes that do.

    trace = stowage.plan.profile(step, sizes={"batch": (2, 4), "seq": (128, 256, 384)})
    plan = stowage.plan.solve(trace, budget="6GiB", at={"batch": 8, "seq": 4096})

``step(batch=2, seq=128)`` runs once per point of the grid (the product of the sizes' points).
Each byte count (a saved tensor's, the memory in use during an op, the bytes an op reads and
writes) is interpolated through the grid, one polynomial per size of degree
one less than its points: two points give a straight line (activations grow with the batch),
three a parabola (unfused attention's scores grow with the square of the sequence); floored at
the least the grid measured. Byte counts follow from shapes, so they come out exact. Times are
noisy: an op's time is a fixed cost plus a cost per byte it reads and writes, one line per kind
of op fitted over all its runs at all the grid's points. What follows from those is derived again
at the sizes asked for: each op's memory besides the saved tensors, each tensor's recompute time
(summed from its ops') and the unconstrained peak (simulated, every saved tensor kept). The planner does all of it (Note [Sized traces] in planner/sized_trace.hpp);
this module checks the grid's steps are one step and carries the records.

The ops, saved tensors and checkpoint regions must be the same at every point (a step whose ops
do not depend on its sizes). stowage.plan.profile runs the step once at the grid's largest point
before recording (a cache grown to the longest sequence seen is grown), and records a grid whose
steps differ once more (every size then run before: a cache kept per size is made); a grid whose
steps still differ is refused (StepsDiffer), naming the first difference and the sizes between
which it lies.
A plan is keyed to the step's ops and saves, not to their sizes: solved at the largest size a
training run takes, it serves every smaller step (every quantity grows with the sizes).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from stowage import _core
from stowage.plan.file_formats import MAX_GRID_POINTS, MAX_POINTS, MAX_SIZE_VALUE, MAX_SIZES, SIZED
from stowage.plan.lifetimes import VERSION, LifetimeTrace, load_trace_document, planner_message, trace_of
from stowage.validation import InputError, read_json

FORMAT = SIZED


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


def _first_op_difference(first: LifetimeTrace, other: LifetimeTrace) -> int:
    for i, (a, b) in enumerate(zip(first.ops, other.ops)):
        if (a.name, a.phase, a.region, a.region_op) != (b.name, b.phase, b.region, b.region_op):
            return i
    return min(len(first.ops), len(other.ops))


def _op_at(trace: LifetimeTrace, index: int) -> str:
    if index >= len(trace.ops):
        return "no op (the step had ended)"
    op = trace.ops[index]
    return f"{op.name} ({op.module or 'the model'}, {op.phase})"


def _saves_by_module(first: LifetimeTrace, other: LifetimeTrace, at_first: str, at_other: str) -> str:
    """The modules whose saved tensors differ in number, at most three."""
    counts = [collections.Counter(t.module for t in trace.tensors) for trace in (first, other)]
    modules = [m for m in dict.fromkeys([*counts[0], *counts[1]]) if counts[0][m] != counts[1][m]]
    shown = "; ".join(f"{m or '(the model)'} saved {counts[0][m]} at {at_first} and {counts[1][m]} at {at_other}"
                      for m in modules[:3])
    return shown + (f"; {len(modules) - 3} modules more" if len(modules) > 3 else "")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _same_structure(first: LifetimeTrace, other: LifetimeTrace, at_first: str, at_other: str) -> None:
    """StepsDiffer naming the first way `other` (recorded at `at_other`) is a different step from
    `first` (at `at_first`)."""
    op = _first_op_difference(first, other)
    if op < max(len(first.ops), len(other.ops)):
        raise StepsDiffer(
            f"the step ran {len(first.ops)} ops at {at_first} and {len(other.ops)} at {at_other}; the first "
            f"to differ is op {op}: {_op_at(first, op)} at {at_first}, {_op_at(other, op)} at {at_other}.\n"
            "Recording at several sizes needs a step whose ops do not depend on its sizes (a size of 1 often "
            "changes them: broadcasting over it needs no reduction in backward)")
    keys = ("created", "last_forward_use", "first_backward_use", "last_backward_use", "recomputable",
            "offloadable", "recompute_inputs", "region", "packs")
    if len(first.tensors) != len(other.tensors):
        raise StepsDiffer(f"the step saved {len(first.tensors)} tensors at {at_first} and {len(other.tensors)} at "
                          f"{at_other} ({_saves_by_module(first, other, at_first, at_other)})")
    for i, (a, b) in enumerate(zip(first.tensors, other.tensors)):
        for key in keys:
            if getattr(a, key) != getattr(b, key):
                raise StepsDiffer(f"saved tensor {i} ({a.module}, made by op {a.created}: "
                                  f"{first.ops[a.created].name}) differs in {key} between {at_first} "
                                  f"({_shown(getattr(a, key))}) and {at_other} ({_shown(getattr(b, key))})")
    if [(r.module, r.checkpointable, r.inputs) for r in first.regions] != \
            [(r.module, r.checkpointable, r.inputs) for r in other.regions]:
        raise StepsDiffer(f"the step's checkpoint regions differ between {at_first} and {at_other}")


@dataclass
class SizedTrace:
    """A sized trace: one step's lifetime traces at each point of a grid of sizes (``traces[i]``
    recorded at ``grid_points(sizes)[i]``), all of one structure (checked on construction); ``at``
    evaluates them at any sizes. Immutable once built."""

    sizes: dict[str, list[int]]
    traces: list[LifetimeTrace]
    _native: Any = field(default=None, init=False, repr=False, compare=False)  # _core.SizedTrace, built on first use

    def __post_init__(self) -> None:
        points = grid_points(self.sizes)
        if len(points) != len(self.traces):
            raise ValueError(f"a grid of {len(points)} points needs as many lifetime traces, not {len(self.traces)}")
        for point, trace in zip(points[1:], self.traces[1:]):
            _same_structure(self.traces[0], trace, _describe(points[0]), _describe(point))

    def at(self, sizes: Mapping[str, int]) -> LifetimeTrace:
        """The step's lifetime trace at `sizes` (every size of the grid, by name)."""
        missing = set(self.sizes) - set(sizes)
        unknown = set(sizes) - set(self.sizes)
        if missing or unknown:
            raise ValueError(f"the trace was recorded at sizes {sorted(self.sizes)}; got {sorted(sizes)}")
        if any(type(value) is not int or not 0 < value <= MAX_SIZE_VALUE for value in sizes.values()):
            raise ValueError(f"sizes must be integers from 1 to {MAX_SIZE_VALUE:,}: {dict(sizes)}")
        try:
            point = self.native().at([sizes[name] for name in self.sizes])
        except ValueError as error:
            raise ValueError(planner_message(error)) from None
        first = self.traces[0]
        ops = [dataclasses.replace(op, io_bytes=n.io_bytes, in_use_bytes=n.in_use_bytes, duration_ms=n.duration_ms,
                                   other_bytes=n.other_bytes) for op, n in zip(first.ops, point.trace.ops)]
        tensors = [dataclasses.replace(t, bytes=n.bytes, recompute_ms=n.recompute_ms)
                   for t, n in zip(first.tensors, point.trace.tensors)]
        return dataclasses.replace(first, ops=ops, tensors=tensors, unconstrained_peak_bytes=point.unconstrained_peak_bytes)

    def native(self) -> Any:
        """The sized trace as the C++ planner takes it (stowage._core.SizedTrace)."""
        if self._native is None:
            self._native = _core.SizedTrace(list(self.sizes.items()), [t.native_trace() for t in self.traces])
        return self._native

    def document(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "sizes": self.sizes,
                "profiles": [trace.document() for trace in self.traces]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.document()))


def _describe(point: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in point.items())


def load_sized_document(document: dict[str, Any], where: str) -> SizedTrace:
    """A SizedTrace from its JSON document; InputError (a ValueError) naming the file, the
    field, the value and the bound (stowage.plan.file_formats), or the first way its grid's
    steps differ."""
    _core.read_sized_lifetimes(document, where)  # its lifetime traces too ("profiles[3]")
    traces = [trace_of(p) for p in document["profiles"]]
    try:
        return SizedTrace({name: list(points) for name, points in document["sizes"].items()}, traces)
    except ValueError as error:
        raise InputError(where, "profiles", str(error)) from None


def load_trace(path: str | Path) -> LifetimeTrace | SizedTrace:
    """Reads a lifetime trace file: a LifetimeTrace, or a SizedTrace for a step recorded at
    several sizes; InputError (a ValueError) naming what is wrong with a file that is neither,
    within the bounds of stowage.validation."""
    document = read_json(path, "a stowage lifetime trace")
    if isinstance(document, dict) and document.get("format") == SIZED:
        return load_sized_document(document, str(path))
    return load_trace_document(document, str(path))
