"""What a run records and how two runs are compared: bitwise, or within the tolerance measured
from torch's own fused and foreach optimizers over the same steps and data.

Contract: a Trace maps (step, kind, name) to a value in the order the run recorded it (the
first difference found is the earliest); step -1 is the initial state, FINAL the end of the
run. Values are tensors (cloned), strings (events) or None (a gradient that is not there).
Kinds in EXACT are compared exactly whatever the mode, as are integer tensors. Both traces'
tensors are on one device (the runs'), and are compared there; RNG states are CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

FINAL = 1 << 20
Key = tuple[int, str, str]
EXACT = frozenset({"event", "rng", "group", "step_count"})


@dataclass
class Failure:
    """An exception that ended a run: where it was raised and the parameters at that moment."""

    error: BaseException
    step: int
    phase: str
    params: dict[str, torch.Tensor]


@dataclass
class Trace:
    values: dict[Key, Any] = field(default_factory=dict)
    failure: Failure | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def record(self, step: int, kind: str, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
        key = (step, kind, name)
        while key in self.values:  # recorded twice in one step (micro-batches, repeated events)
            key = (step, kind, key[2] + "'")
        self.values[key] = value


def where(key: Key) -> str:
    step, kind, name = key
    at = "at the end" if step == FINAL else "initially" if step < 0 else f"at step {step}"
    return f"{kind} {name} {at}"


def _max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| (NaN in both at the same place counts as equal); inf when they differ in
    shape, dtype, device or where NaN is."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return float("inf")
    if torch.equal(a, b):  # the common case, in one reduction (NaN never equals: it takes the long way)
        return 0.0
    if not a.is_floating_point():  # counters (num_batches_tracked): their difference
        return float((a.long() - b.long()).abs().max()) if a.numel() else 0.0
    a64, b64 = a.double(), b.double()
    nan_a, nan_b = a64.isnan(), b64.isnan()
    if not torch.equal(nan_a, nan_b):
        return float("inf")
    same_inf = (a64 == b64)
    difference = (a64 - b64).abs().masked_fill(nan_a | same_inf, 0.0)
    return float(difference.max()) if difference.numel() else 0.0


def _ulp_floor(value: torch.Tensor, ulps: int = 2) -> float:
    """`ulps` units in the last place of the tensor's largest magnitude."""
    if not value.is_floating_point() or value.numel() == 0:
        return 0.0
    largest = float(value.detach().abs().nan_to_num(0.0, 0.0, 0.0).max())
    if largest == 0.0:
        return 0.0
    exponent = torch.frexp(torch.tensor(largest, dtype=torch.float64))[1].item() - 1
    return ulps * torch.finfo(value.dtype).eps * 2.0 ** exponent


Tolerance = dict[str, float]
# The tolerance is one number for "parameters and both moments"; values computed from the
# parameters (losses, gradients, buffers, ...) get one each, measured the same way.
STATE_KINDS = frozenset({"param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"})


def family(kind: str) -> str:
    return "state" if kind in STATE_KINDS else kind


def measure_tolerance(fused: Trace, foreach: Trace) -> Tolerance:
    """Twice the largest difference between torch's fused and foreach runs over the whole run (the
    same steps and data): one for parameters and both moments, one per other kind of value."""
    out: Tolerance = {}
    for key, a in fused.values.items():
        b = foreach.values.get(key)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and key[1] not in EXACT:
            difference = _max_difference(a, b)
            if difference != float("inf"):
                out[family(key[1])] = max(out.get(family(key[1]), 0.0), 2 * difference)
    return out


def allowed(key: Key, expected: torch.Tensor, tolerance: Tolerance | None) -> float:
    """What a value may differ by: nothing without a tolerance (or for an exact kind); else the
    measured tolerance, and at least 2 ulps of the value's largest magnitude. (The host kernel
    rounds where torch's CPU AdamW rounds, but torch's vectorised sqrt is not correctly rounded,
    so a parameter may land an ulp away where torch's fused and foreach runs happened to agree.)"""
    if tolerance is None or key[1] in EXACT:
        return 0.0
    return max(tolerance.get(family(key[1]), 0.0), _ulp_floor(expected))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _max_difference(a, b) == 0.0
    return a == b


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {tuple(value.shape)} {value.dtype}"
    return repr(value)


def difference(ours: Trace, reference: Trace, tolerance: Tolerance | None) -> str | None:
    """None when `ours` records what `reference` does (bitwise without a tolerance), else the
    first difference, named, with its size; the largest one (against what it may differ by) when
    it is another; and how many values differ in all."""
    found: list[tuple[float, str]] = []
    for key, expected in reference.values.items():
        if key not in ours.values:
            found.append((float("inf"), f"{where(key)}: not recorded"))
            continue
        got = ours.values[key]
        if not isinstance(expected, torch.Tensor) or not isinstance(got, torch.Tensor):
            if not _same(got, expected):
                found.append((float("inf"), f"{where(key)}: {_describe(got)}, torch: {_describe(expected)}"))
            continue
        if got.device != expected.device:
            found.append((float("inf"), f"{where(key)}: on {got.device}, torch's on {expected.device}"))
            continue
        size, limit = _max_difference(got, expected), allowed(key, expected, tolerance)
        if size > limit:
            said = "bitwise" if tolerance is None or key[1] in EXACT else f"tolerance {limit:.3g}"
            ratio = size / limit if limit else float("inf")
            times = f", x{ratio:.3g}" if ratio != float("inf") else ""
            found.append((ratio, f"{where(key)}: max |diff| {size:.3g} ({said}{times})"))
    found += [(float("inf"), f"{where(k)}: recorded, torch has no such value") for k in ours.values
              if k not in reference.values]
    if not found:
        return None
    first, worst = found[0][1], max(found, key=lambda f: f[0])[1]
    said = first if worst == first else f"{first}; largest: {worst}"
    return said + (f" ({len(found)} values differ)" if len(found) > 1 else "")


def parameters_at(trace: Trace, step: int) -> dict[str, torch.Tensor]:
    """The parameters as they were when `step` began (recorded after the step before it)."""
    out: dict[str, torch.Tensor] = {}
    for (at, kind, name), value in trace.values.items():
        if kind == "param" and at < step:
            out[name] = value
    return out


def parameters_differ(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
                      tolerance: Tolerance | None) -> str | None:
    """None when the parameters match the reference's (as `difference` compares them), else the
    first that does not."""
    for name, expected in reference.items():
        got = ours.get(name)
        if got is None:
            return f"parameter {name}: missing"
        size, limit = _max_difference(got, expected), allowed((0, "param", name), expected, tolerance)
        if size > limit:
            return f"parameter {name}: max |diff| {size:.3g} (allowed {limit:.3g})"
    return None
