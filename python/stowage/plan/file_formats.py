"""The planner's files as schemas with bounds: a lifetime trace (``stowage-lifetimes``), a step
recorded at several sizes (``stowage-sized-lifetimes``) and a plan (``stowage-plan``). Every
reader of them checks a document here first, before anything is built from it: a file from
elsewhere (a profile passed around a team) is refused with the file, the field, the value and
the bound, never met later as a traceback or a solve that does not end.

The bounds, each with its reason:

- bytes: MAX_BYTES for one tensor (1 PiB, as the snapshot reader's MAX_SIZE: beyond any device)
  and MAX_TOTAL_BYTES for memory in use and for all saved tensors together (64 PiB), so that
  every sum the simulator makes stays exact in 64 bits;
- times: MAX_MS an op (a day: a step is never longer), so the step's sum stays finite;
- counts: MAX_OPS ops, MAX_TENSORS tensors, MAX_REGIONS regions (far beyond a real step's
  thousands; the file's size bounds them first), MAX_TEXT characters a name;
- indices: within the document's own lists (an op, a tensor, a region the trace has);
- the cost model: bandwidths from MIN_BYTES_PER_MS to MAX_BYTES_PER_MS, and a prefetch depth no
  deeper than the trace has saved tensors (each page is one: a deeper one is the same plan,
  and the solver tries each depth);
- sizes (a sized profile): MAX_SIZES sizes of MIN_POINTS to MAX_POINTS points each, at most
  MAX_GRID_POINTS points in the grid (checked before the grid is built), each size up to
  MAX_SIZE_VALUE;
- a plan: a budget of 1 byte to MAX_TOTAL_BYTES, one decision per saved tensor, each one the
  runtime can apply to it.
"""

from __future__ import annotations

from typing import Any, Mapping

from stowage.validation import (Bool, Choice, InputError, Int, ListOf, Number, Record, Ref, Refused, Row, Text,
                                check, refuse, shown)

LIFETIMES = "stowage-lifetimes"
SIZED = "stowage-sized-lifetimes"
PLAN = "stowage-plan"
VERSION = 1

MAX_BYTES = 2**50
MAX_TOTAL_BYTES = 2**56
MAX_MS = 86_400_000.0
MAX_OPS = 5_000_000
MAX_TENSORS = 5_000_000
MAX_REGIONS = 1_000_000
MAX_TEXT = 4096
MAX_CALLS = 2**31
MIN_BYTES_PER_MS = 1e3  # 1 MB/s
MAX_BYTES_PER_MS = 1e12  # 1 PB/s
DEFAULT_PREFETCH_PAGES = 2  # what a trace of fewer saved tensors may still name (the calibration's)
MAX_SIZES = 8
MIN_POINTS = 2
MAX_POINTS = 8
MAX_GRID_POINTS = 256
MAX_SIZE_VALUE = 2**31
DECISIONS = ("keep", "offload", "recompute")

_TOTAL = "2**56 bytes, 64 PiB: sums stay exact in 64 bits"
_LINK = "1 MB/s to 1 PB/s, in bytes per ms"
_OP_INDEX = Int(0, Ref("last_op", "the trace's last op"))
_TENSOR_INDEX = Int(0, Ref("last_tensor", "the trace's last saved tensor"))
_SAVE = Row(Text(MAX_TEXT), Int(-1, MAX_CALLS, "2**31"), Int(0, MAX_OPS, "the most ops a trace has"))  # (module path, call (-1: none), save)
_MS = Number(0, MAX_MS, "a day: no step is longer")
OP = Record({"name": Text(MAX_TEXT), "module": Text(MAX_TEXT), "phase": Choice("forward", "backward", "optimizer"),
             "duration_ms": _MS},
            {"other_bytes": Int(0, MAX_TOTAL_BYTES, _TOTAL),
             "region": Int(-1, Ref("last_region", "the trace's last checkpoint region")),
             "region_op": Int(-1, MAX_OPS, "the most ops a trace has"), "io_bytes": Int(0, MAX_TOTAL_BYTES, _TOTAL),
             "in_use_bytes": Int(-MAX_TOTAL_BYTES, MAX_TOTAL_BYTES, _TOTAL)})
TENSOR = Record({"module": Text(MAX_TEXT), "bytes": Int(0, MAX_BYTES, "2**50 bytes, 1 PiB: beyond any device"), "created": _OP_INDEX,
                 "last_forward_use": _OP_INDEX, "first_backward_use": _OP_INDEX, "last_backward_use": _OP_INDEX},
                {"recompute_ms": _MS, "recomputable": Bool(), "offloadable": Bool(),
                 "recompute_inputs": ListOf(_TENSOR_INDEX, MAX_TENSORS),
                 "region": Int(-1, Ref("last_region", "the trace's last checkpoint region")),
                 "packs": ListOf(_SAVE, MAX_OPS)})
REGION = Record({"module": Text(MAX_TEXT), "call": Int(0, MAX_CALLS, "2**31"), "checkpointable": Bool(),
                 "ops": ListOf(Text(MAX_TEXT), MAX_OPS), "inputs": ListOf(_TENSOR_INDEX, MAX_TENSORS)})
COST = Record({"to_host_bytes_per_ms": Number(MIN_BYTES_PER_MS, MAX_BYTES_PER_MS, _LINK),
               "to_device_bytes_per_ms": Number(MIN_BYTES_PER_MS, MAX_BYTES_PER_MS, _LINK),
               "prefetch_pages": Int(0, Ref("prefetch_pages", "the trace's saved tensors (a page each: no deeper "
                                                              "prefetch exists)"))})
PROFILE = Record({"format": Choice(LIFETIMES), "version": Int(VERSION, VERSION), "ops": ListOf(OP, MAX_OPS),
                  "tensors": ListOf(TENSOR, MAX_TENSORS), "regions": ListOf(REGION, MAX_REGIONS), "cost": COST,
                  "unconstrained_peak_bytes": Int(0, MAX_TOTAL_BYTES, _TOTAL)},
                 {"kept_saves": ListOf(_SAVE, MAX_OPS)})


def _header(document: Any, where: str, form: str, kind: str) -> None:
    """The format and version first, so that another file is named as such."""
    if not isinstance(document, dict) or document.get("format") != form:
        found = document.get("format") if isinstance(document, dict) else None
        raise InputError(where, "format" if found is not None else "",
                         f"not {kind} (format {shown(found)}, not {form!r})" if found is not None
                         else f"not {kind} (no format {form!r})")
    if document.get("version") != VERSION:
        raise InputError(where, "version", f"{kind} version {shown(document.get('version'))}; this stowage "
                                           f"reads version {VERSION}")


def profile_bounds(document: Mapping[str, Any]) -> dict[str, int]:
    """The bounds a profile document sets for itself (its counts)."""
    tensors = len(document["tensors"])
    return {"last_op": len(document["ops"]) - 1, "last_tensor": tensors - 1,
            "last_region": len(document["regions"]) - 1,
            "prefetch_pages": max(DEFAULT_PREFETCH_PAGES, tensors)}


def check_profile(document: Any, where: str, field: str = "") -> None:
    """InputError for the first part of a lifetime trace document outside its schema and bounds
    (``field``: where the document sits in a larger one, as a sized profile's or a plan's)."""
    if field == "":
        _header(document, where, LIFETIMES, "a stowage lifetime trace")
    _check_lists(document, where, field)
    check(document, PROFILE, where, profile_bounds(document), field)
    _check_across(document, where, [field] if field else [])


def _check_lists(document: Any, where: str, field: str) -> None:
    """The document is an object whose ops, tensors and regions are lists: what its bounds are
    counted from."""
    path = [field] if field else []
    if not isinstance(document, dict):
        raise refuse(where, path, f"expected an object, got {shown(document)}")
    for name in ("ops", "tensors", "regions"):
        if name not in document:
            raise refuse(where, path, f"missing field {name!r}")
        if type(document[name]) is not list:
            raise refuse(where, [*path, name], f"expected a list, got {shown(document[name])}")


def _check_across(document: Mapping[str, Any], where: str, path: list[str | int]) -> None:
    """The rules that span fields: each op's place in its region, and the saved bytes in all."""
    regions = document["regions"]
    for i, op in enumerate(document["ops"]):
        region, region_op = op.get("region", -1), op.get("region_op", -1)
        last = len(regions[region]["ops"]) - 1 if region >= 0 else -1
        if (region < 0 and region_op != -1) or (region >= 0 and not 0 <= region_op <= last):
            raise refuse(where, [*path, "ops", i, "region_op"],
                         f"{region_op} is not an op of region {region}" + (f" (0 to {last})" if region >= 0 else ""))
    total = sum(tensor["bytes"] for tensor in document["tensors"])
    if total > MAX_TOTAL_BYTES:
        raise refuse(where, [*path, "tensors"], f"{total:,} saved bytes in all is above {MAX_TOTAL_BYTES:,}")
    for t, tensor in enumerate(document["tensors"]):
        if tensor.get("recomputable", False) and tensor.get("region", -1) < 0:
            raise refuse(where, [*path, "tensors", t, "recomputable"],
                         "true for a tensor of no checkpoint region (region -1): stowage recomputes only regions")


def check_cost(cost: Any, where: str, tensors: int) -> None:
    """InputError for a cost model outside its bounds (a profile's, or one given to solve)."""
    check(cost, COST, where, {"prefetch_pages": max(DEFAULT_PREFETCH_PAGES, tensors)}, "cost")


_SIZE_NAME = Text(64)


def check_sized(document: Any, where: str) -> None:
    """InputError for the first part of a sized profile document outside its schema and bounds,
    but for its profiles (load_profile_document checks each); the grid's size is checked from the
    sizes alone, before any grid is built."""
    _header(document, where, SIZED, "a stowage sized lifetime trace")
    check(document, Record({"format": Choice(SIZED), "version": Int(VERSION, VERSION),
                            "sizes": _SizesSpec(), "profiles": ListOf(_AnyObject(), MAX_GRID_POINTS)}),
          where)
    sizes = document["sizes"]
    points = 1
    for name, values in sizes.items():
        points *= len(values)
    if points > MAX_GRID_POINTS:
        raise refuse(where, ["sizes"], f"a grid of {points:,} points is above {MAX_GRID_POINTS}")
    if points != len(document["profiles"]):
        raise refuse(where, ["profiles"], f"{len(document['profiles'])} profiles for a grid of {points} points")


class _AnyObject(Record):
    """An object whose fields another check looks at."""

    def __init__(self) -> None:
        super().__init__({})

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not dict:
            super().walk(value, bounds)


class _SizesSpec(Record):
    """``{"batch": [2, 4], "seq": [128, 256, 384]}``: MAX_SIZES sizes, each MIN_POINTS to
    MAX_POINTS distinct points of 1 to MAX_SIZE_VALUE."""

    POINTS = ListOf(Int(1, MAX_SIZE_VALUE, "2**31"), MAX_POINTS, MIN_POINTS)

    def __init__(self) -> None:
        super().__init__({})

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not dict or not value:
            raise Refused(f"expected an object of 1 to {MAX_SIZES} sizes, got {shown(value)}")
        if len(value) > MAX_SIZES:
            raise Refused(f"{len(value):,} sizes is above {MAX_SIZES}")
        for name, points in value.items():
            try:
                _SIZE_NAME.walk(name, bounds)
                self.POINTS.walk(points, bounds)
                if len(set(points)) != len(points):
                    raise Refused(f"{points} repeats a point")
            except Refused as refused:
                refused.path.append(name)
                raise


PLAN_DOCUMENT = Record({"format": Choice(PLAN), "version": Int(VERSION, VERSION), "budget": Int(1, MAX_TOTAL_BYTES, _TOTAL),
                        "decisions": ListOf(Choice(*DECISIONS), MAX_TENSORS), "profile": _AnyObject()})


def check_plan(document: Any, where: str) -> None:
    """InputError for the first part of a plan document outside its schema and bounds, but for
    its profile (load_profile_document checks that) and the decisions against it
    (check_decisions, once the profile is read)."""
    _header(document, where, PLAN, "a stowage plan")
    check(document, PLAN_DOCUMENT, where)


def check_decisions(decisions: list[str], tensors: list[Any], where: str) -> None:
    """InputError unless there is one decision per saved tensor, each one the runtime can apply
    to its tensor (TensorRecords)."""
    if len(decisions) != len(tensors):
        raise refuse(where, ["decisions"], f"{len(decisions):,} decisions for {len(tensors):,} saved tensors")
    recomputed: dict[int, int] = {}
    offloaded: dict[int, int] = {}
    for t, (decision, tensor) in enumerate(zip(decisions, tensors)):
        problem = decision_problem(decision, tensor.recomputable, tensor.offloadable, tensor.region)
        if problem is None and tensor.region >= 0 and decision != "keep":
            mine, other = (recomputed, offloaded) if decision == "recompute" else (offloaded, recomputed)
            mine.setdefault(tensor.region, t)
            if tensor.region in other:
                problem = (f"{decision!r} in region {tensor.region}, where saved tensor {other[tensor.region]} is "
                           f"{'offloaded' if decision == 'recompute' else 'recomputed'}: a region recomputes or "
                           "offloads, never both (a checkpoint keeps what it saves out of the pager's reach)")
        if problem is not None:
            raise refuse(where, ["decisions", t], problem)


def decision_problem(decision: str, recomputable: bool, offloadable: bool, region: int) -> str | None:
    """Why the runtime cannot apply `decision` to a tensor, if it cannot."""
    if decision == "recompute" and (not recomputable or region < 0):
        return "'recompute' for a tensor that cannot be recomputed (not recomputable, or in no checkpoint region)"
    if decision == "offload" and not offloadable:
        return "'offload' for a tensor that cannot be offloaded"
    return None
