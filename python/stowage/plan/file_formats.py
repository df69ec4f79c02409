"""The planner's files: a lifetime trace (``stowage-lifetimes``), a step recorded at several
sizes (``stowage-sized-lifetimes``) and a plan (``stowage-plan``). Every reader of them checks a
document here first, before anything is built from it: a file from elsewhere (a lifetime trace passed
around a team) is refused with the file, the field, the value and the bound, never met later as a
traceback or a solve that does not end.

The checking is the planner's (planner/file_formats.hpp, Note [Planner files]: the schemas, each
bound with its reason, and the rules across fields; planner/schema.hpp, the walker): it walks the
document json.loads made, in C++, and builds the C++ trace in the same call. A refusal comes back
as (field, problem), raised here as InputError with the file. The bounds are the planner's too:

- bytes: MAX_BYTES for one tensor (1 PiB) and MAX_TOTAL_BYTES for memory in use and for all
  saved tensors together (64 PiB); times: MAX_MS an op (a day);
- counts: MAX_OPS ops, MAX_TENSORS tensors, MAX_REGIONS regions, MAX_TEXT characters a name;
- the cost model: bandwidths from MIN_BYTES_PER_MS to MAX_BYTES_PER_MS, a prefetch depth no
  deeper than the trace has saved tensors (or DEFAULT_PREFETCH_DEPTH);
- sizes (a sized trace): MAX_SIZES sizes of MIN_POINTS to MAX_POINTS points each, at most
  MAX_GRID_POINTS points in the grid, each size up to MAX_SIZE_VALUE;
- a plan: a budget of 1 byte to MAX_TOTAL_BYTES, one decision per saved tensor (DECISIONS), each
  one the runtime can apply to it.
"""

from __future__ import annotations

from typing import Any

from stowage import _core
from stowage.validation import InputError

_LIMITS = _core.plan_file_limits
LIFETIMES: str = _LIMITS.LIFETIMES
SIZED: str = _LIMITS.SIZED
PLAN: str = _LIMITS.PLAN
VERSION: int = _LIMITS.VERSION
MAX_BYTES: int = _LIMITS.MAX_BYTES
MAX_TOTAL_BYTES: int = _LIMITS.MAX_TOTAL_BYTES
MAX_MS: float = _LIMITS.MAX_MS
MAX_OPS: int = _LIMITS.MAX_OPS
MAX_TENSORS: int = _LIMITS.MAX_TENSORS
MAX_REGIONS: int = _LIMITS.MAX_REGIONS
MAX_TEXT: int = _LIMITS.MAX_TEXT
MAX_CALLS: int = _LIMITS.MAX_CALLS
MIN_BYTES_PER_MS: float = _LIMITS.MIN_BYTES_PER_MS
MAX_BYTES_PER_MS: float = _LIMITS.MAX_BYTES_PER_MS
DEFAULT_PREFETCH_DEPTH: int = _LIMITS.DEFAULT_PREFETCH_DEPTH
MAX_SIZES: int = _LIMITS.MAX_SIZES
MIN_POINTS: int = _LIMITS.MIN_POINTS
MAX_POINTS: int = _LIMITS.MAX_POINTS
MAX_GRID_POINTS: int = _LIMITS.MAX_GRID_POINTS
MAX_SIZE_VALUE: int = _LIMITS.MAX_SIZE_VALUE
DECISIONS = ("keep", "offload", "recompute")
def _read(result: Any, where: str) -> Any:
    """What a reader of stowage._core returned, or InputError for its refusal, (field, problem)."""
    if isinstance(result, tuple):
        raise InputError(where, *result)
    return result


def check_trace(document: Any, where: str, field: str = "") -> Any:
    """The C++ trace (stowage._core.LifetimeTrace) a lifetime trace document holds; InputError for
    the first part of it outside its schema, bounds and rules (``field``: where the document sits
    in a larger one, as a sized trace's or a plan's)."""
    return _read(_core.read_lifetimes(document, field), where)


def check_cost(cost: Any, where: str, tensors: int) -> None:
    """InputError for a cost model outside its bounds (a lifetime trace's, or one given to solve)."""
    _read(_core.check_plan_cost(cost, tensors), where)


def check_sized(document: Any, where: str) -> list[Any]:
    """The C++ traces of a sized trace document, one per grid point; InputError for the first
    part of it outside its schema and bounds, its lifetime traces' included (the grid's size is checked
    from the sizes alone, before any grid is built). Whether its steps are one step is
    stowage.plan.sizes' to check."""
    return _read(_core.read_sized_lifetimes(document), where)


def check_plan(document: Any, where: str) -> Any:
    """The C++ trace of a plan document's lifetime trace; InputError for the first part of the plan
    outside its schema and bounds, its lifetime trace's included, or a decision the runtime cannot apply
    to its tensor (one per saved tensor; a region recomputes or offloads, never both)."""
    return _read(_core.read_plan_document(document), where)


def decision_problem(decision: str, recomputable: bool, offloadable: bool, region: int) -> str | None:
    """Why the runtime cannot apply `decision` to a tensor, if it cannot."""
    return _core.plan_decision_problem(decision, recomputable, offloadable, region)
