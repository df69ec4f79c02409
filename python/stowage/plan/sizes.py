"""A step recorded at a grid of sizes (batch, sequence length, ...): every byte count and time of
its lifetime trace as a polynomial in the sizes, so one recording serves steps of any size, and a
model that does not fit at the size it trains at is profiled at sizes that do.

    profile = stowage.plan.profile(step, sizes={"batch": (2, 4), "seq": (128, 256, 384)})
    plan = stowage.plan.solve(profile, budget="6GiB", at={"batch": 8, "seq": 4096})

``step(batch=2, seq=128)`` runs once per point of the grid (the product of the sizes' points).
Each byte count (a saved tensor's, the memory in use during an op, the bytes an op reads and
writes) is interpolated through the grid, one polynomial per size of degree
one less than its points: two points give a straight line (activations grow with the batch),
three a parabola (unfused attention's scores grow with the square of the sequence); floored at
the least the grid measured. Byte counts follow from shapes, so they come out exact. Times are
noisy: an op's time is a fixed cost plus a cost per byte it reads and writes, one line per kind
of op fitted over all its runs at all the grid's points. What follows from those is derived again
at the sizes asked for: each op's memory besides the saved tensors, each tensor's recompute time
(summed from its ops') and the unconstrained peak (simulated).

The ops, saved tensors and checkpoint regions must be the same at every point (a step whose ops
do not depend on its sizes); a grid whose steps differ is refused, naming the first difference.
A plan is keyed to the step's ops and saves, not to their sizes: solved at the largest size a
training run takes, it serves every smaller step (every quantity grows with the sizes).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from stowage import _core
from stowage.plan.building import set_other_bytes, set_recompute_times
from stowage.plan.file_formats import (MAX_BYTES, MAX_GRID_POINTS, MAX_POINTS, MAX_SIZE_VALUE, MAX_SIZES,
                                       MAX_TOTAL_BYTES, SIZED, check_sized)
from stowage.plan.lifetimes import VERSION, LifetimeProfile, OpRecord, TensorRecord, load_profile_document
from stowage.validation import InputError

FORMAT = SIZED


def grid_points(sizes: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """The grid's points in the order a SizedProfile keeps its profiles; ValueError for sizes
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


def _lagrange(points: Sequence[int], at: float) -> list[float]:
    weights = []
    for i, xi in enumerate(points):
        weight = 1.0
        for j, xj in enumerate(points):
            if j != i:
                weight *= (at - xj) / (xi - xj)
        weights.append(weight)
    return weights


def _same_structure(first: LifetimeProfile, other: LifetimeProfile, where: str) -> None:
    """ValueError naming the first way `other` is a different step from `first`."""
    if len(first.ops) != len(other.ops):
        raise ValueError(f"the step ran {len(first.ops)} ops at the first size and {len(other.ops)} at {where}: "
                         "profiling at several sizes needs a step whose ops do not depend on its sizes (a size of 1 often "
                         "changes them: broadcasting over it needs no reduction in backward)")
    for i, (a, b) in enumerate(zip(first.ops, other.ops)):
        if (a.name, a.phase, a.region, a.region_op) != (b.name, b.phase, b.region, b.region_op):
            raise ValueError(f"op {i} is {a.name} ({a.module}) at the first size and {b.name} ({b.module}) at {where}")
    keys = ("created", "last_forward_use", "first_backward_use", "last_backward_use", "recomputable",
            "offloadable", "recompute_inputs", "region", "packs")
    if len(first.tensors) != len(other.tensors):
        raise ValueError(f"the step saved {len(first.tensors)} tensors at the first size and "
                         f"{len(other.tensors)} at {where}")
    for i, (a, b) in enumerate(zip(first.tensors, other.tensors)):
        for key in keys:
            if getattr(a, key) != getattr(b, key):
                raise ValueError(f"saved tensor {i} ({a.module}) differs in {key} between the first size and {where}")
    if [(r.module, r.checkpointable, r.inputs) for r in first.regions] != \
            [(r.module, r.checkpointable, r.inputs) for r in other.regions]:
        raise ValueError(f"the step's checkpoint regions differ between the first size and {where}")


@dataclass
class SizedProfile:
    """One step's lifetime traces at each point of a grid of sizes (``profiles[i]`` recorded at
    ``grid_points(sizes)[i]``), all of one structure (checked on construction); ``at`` evaluates
    them at any sizes. Immutable once built."""

    sizes: dict[str, list[int]]
    profiles: list[LifetimeProfile]

    def __post_init__(self) -> None:
        points = grid_points(self.sizes)
        if len(points) != len(self.profiles):
            raise ValueError(f"a grid of {len(points)} points needs as many profiles, not {len(self.profiles)}")
        for point, profile in zip(points[1:], self.profiles[1:]):
            _same_structure(self.profiles[0], profile, _describe(point))

    def at(self, sizes: Mapping[str, int]) -> LifetimeProfile:
        """The step's lifetime trace at `sizes` (every size of the grid, by name)."""
        missing = set(self.sizes) - set(sizes)
        unknown = set(sizes) - set(self.sizes)
        if missing or unknown:
            raise ValueError(f"the profile was recorded at sizes {sorted(self.sizes)}; got {sorted(sizes)}")
        if any(type(value) is not int or not 0 < value <= MAX_SIZE_VALUE for value in sizes.values()):
            raise ValueError(f"sizes must be integers from 1 to {MAX_SIZE_VALUE:,}: {dict(sizes)}")
        weights = [1.0]
        for name, points in self.sizes.items():
            along = _lagrange(points, float(sizes[name]))
            weights = [w * a for w in weights for a in along]
        first = self.profiles[0]
        times = _op_times(self.profiles)
        ops = []
        for i, op in enumerate(first.ops):
            at_grid = [p.ops[i] for p in self.profiles]
            io_bytes = _interpolate(weights, [o.io_bytes for o in at_grid])
            fixed, per_byte = times[op.name]
            ops.append(dataclasses.replace(op, io_bytes=io_bytes, in_use_bytes=_interpolate(weights, [o.in_use_bytes for o in at_grid]),
                                           duration_ms=fixed + per_byte * io_bytes))
        tensors = [dataclasses.replace(t, bytes=_interpolate(weights, [p.tensors[i].bytes for p in self.profiles]))
                   for i, t in enumerate(first.tensors)]
        _within_bounds(ops, tensors, sizes)
        set_other_bytes(ops, tensors)
        set_recompute_times(ops, tensors)
        profile = dataclasses.replace(first, ops=ops, tensors=tensors)
        unchanged = _core.plan_simulate(profile.native_trace(), profile.native_cost(), ["keep"] * len(tensors))
        return dataclasses.replace(profile, unconstrained_peak_bytes=int(unchanged["peak_bytes"]))

    def document(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "sizes": self.sizes,
                "profiles": [profile.document() for profile in self.profiles]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.document()))


def _op_times(profiles: Sequence[LifetimeProfile]) -> dict[str, tuple[float, float]]:
    """Per op name (aten::mm, ...): a fixed time and a time per byte read and written, fitted by
    least squares over every run of that op at every point of the grid, neither negative. One
    line per kind of op, not per op: small ops' times at small sizes are mostly noise, which a
    line through a few points of one op would carry far beyond the grid."""
    points: dict[str, list[tuple[float, float]]] = {}
    for profile in profiles:
        for op in profile.ops:
            points.setdefault(op.name, []).append((float(op.io_bytes), op.duration_ms))
    return {name: _line(pairs) for name, pairs in points.items()}


def _line(pairs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    xs, ts = [x for x, _ in pairs], [t for _, t in pairs]
    mean_x, mean_t = sum(xs) / len(xs), sum(ts) / len(ts)
    spread = sum((x - mean_x) ** 2 for x in xs)
    per_byte = sum((x - mean_x) * (t - mean_t) for x, t in zip(xs, ts)) / spread if spread else 0.0
    if per_byte <= 0:
        return mean_t, 0.0
    fixed = mean_t - per_byte * mean_x
    if fixed < 0:  # through the origin instead
        return 0.0, sum(x * t for x, t in zip(xs, ts)) / sum(x * x for x in xs)
    return fixed, per_byte


def _interpolate(weights: Sequence[float], values: Sequence[int]) -> int:
    """A byte count at one point from its values at the grid's points (`weights`: the point's
    interpolation weights), floored at the least of them."""
    total = sum(w * v for w, v in zip(weights, values))
    if not math.isfinite(total) or total > MAX_TOTAL_BYTES:
        raise ValueError("a byte count interpolates beyond any device's: sizes far beyond those recorded")
    return int(round(max(min(values), total)))


def _within_bounds(ops: Sequence[OpRecord], tensors: Sequence[TensorRecord], sizes: Mapping[str, int]) -> None:
    """ValueError when the byte counts interpolated at `sizes` leave the bounds a profile file is
    held to (stowage.plan.file_formats): a size far beyond the grid."""
    where = f"at {_describe(sizes)}"
    for i, tensor in enumerate(tensors):
        if tensor.bytes > MAX_BYTES:
            raise ValueError(f"{where}, saved tensor {i} ({tensor.module}) would hold {tensor.bytes:,} bytes, above "
                             f"{MAX_BYTES:,}: sizes far beyond those recorded")
    if sum(tensor.bytes for tensor in tensors) > MAX_TOTAL_BYTES or any(
            abs(op.in_use_bytes) > MAX_TOTAL_BYTES or op.io_bytes > MAX_TOTAL_BYTES for op in ops):
        raise ValueError(f"{where}, the step would use more than {MAX_TOTAL_BYTES:,} bytes: sizes far beyond "
                         "those recorded")


def _describe(point: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in point.items())


def load_sized_document(document: dict[str, Any], where: str) -> SizedProfile:
    """A SizedProfile from its JSON document; InputError (a ValueError) naming the file, the
    field, the value and the bound (stowage.plan.file_formats), or the first way its grid's
    steps differ."""
    check_sized(document, where)
    profiles = [load_profile_document(p, where, f"profiles[{i}]") for i, p in enumerate(document["profiles"])]
    try:
        return SizedProfile({name: list(points) for name, points in document["sizes"].items()}, profiles)
    except ValueError as error:
        raise InputError(where, "profiles", str(error)) from None
