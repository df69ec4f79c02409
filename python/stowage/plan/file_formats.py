"""The planner's files: a lifetime trace (``stowage-lifetimes``), a step recorded at several
sizes (``stowage-sized-lifetimes``) and a plan (``stowage-plan``). Every reader of them checks a
document first, before anything is built from it: a file from elsewhere (a lifetime trace passed
around a team) is refused with the file, the field, the value and the bound, never met later as a
traceback or a solve that does not end.

The checking is the planner's (planner/file_formats.hpp, Note [Planner files]: the schemas, each
bound with its reason, and the rules across fields; planner/schema.hpp, the walker): it walks the
document json.loads made, in C++, and builds the C++ trace in the same call; a refusal is raised
there as stowage.validation's InputError naming the file and the field (stowage._core's
read_lifetimes, read_sized_lifetimes, read_plan_document, check_plan_cost). The bounds are the
planner's too (planner/file_formats.hpp, each with its reason): bytes (1 PiB a tensor, 64 PiB in
use or saved in all), an op's time (a day), counts of ops, tensors, regions and a name's
characters, the cost model's bandwidths and prefetch depth, a sized trace's sizes and points, a
plan's budget (1 byte to MAX_TOTAL_BYTES) and one decision per saved tensor that the runtime can
apply to it. The formats' names, and the bounds Python checks itself (a grid of sizes, before
recording one), are below.
"""

from __future__ import annotations

from stowage import _core

_LIMITS = _core.plan_file_limits
LIFETIMES: str = _LIMITS.LIFETIMES
SIZED: str = _LIMITS.SIZED
PLAN: str = _LIMITS.PLAN
VERSION: int = _LIMITS.VERSION
MAX_TOTAL_BYTES: int = _LIMITS.MAX_TOTAL_BYTES
MAX_SIZES: int = _LIMITS.MAX_SIZES
MAX_POINTS: int = _LIMITS.MAX_POINTS
MAX_GRID_POINTS: int = _LIMITS.MAX_GRID_POINTS
MAX_SIZE_VALUE: int = _LIMITS.MAX_SIZE_VALUE
