"""The planner's files: a lifetime trace (``stowage-lifetimes``), a step recorded at several
sizes (``stowage-sized-lifetimes``) and a plan (``stowage-plan``), read into and written from
the planner's own trace (stowage._core.LifetimeTrace: ops, saved tensors, regions, cost model,
kept saves, Note [Lifetime trace] in planner/lifetime_trace.hpp; its ``document()`` is the first
format's JSON document).

    {"format": "stowage-lifetimes", "version": 1,
     "ops":     [{"name": "aten::mm", "module": "blocks.0.mlp", "phase": "forward",
                  "duration_ms": 0.41, "other_bytes": 1048576, "region": 0, "region_op": 3,
                  "io_bytes": 3145728, "in_use_bytes": 5242880}, ...],
     "tensors": [{"module": "blocks.0.mlp", "bytes": 4194304, "created": 12,
                  "last_forward_use": 14, "first_backward_use": 80, "last_backward_use": 81,
                  "recompute_ms": 0.45, "recomputable": true, "offloadable": true,
                  "recompute_inputs": [3], "region": 0, "packs": [["blocks.0.mlp.fc1", 0, 0]]}, ...],
     "regions": [{"module": "blocks.0", "call": 0, "checkpointable": true, "ops": ["aten::native_layer_norm", ...],
                  "inputs": [3]}, ...],
     "cost": {"to_host_bytes_per_ms": 1.2e7, "to_device_bytes_per_ms": 1.2e7, "prefetch_depth": 2},
     "unconstrained_peak_bytes": 123456789, "kept_saves": [["tokens", 0, 0]]}

Ops are in the order they ran (forward, backward, then an optimizer step if the step had one);
``in_use_bytes`` is the device memory in use during the op (its peak, relative to the step's
start: below 0 where the step freed what it began with, such as the last step's gradients) and
``other_bytes`` the part of it that is not a saved tensor; ``io_bytes`` the bytes of its tensor
arguments and results (the work an op's time follows as sizes change, stowage.plan.sizes). A
tensor is a storage saved for backward, ``created`` by the op that produced it; ``packs`` are
where autograd saved it: (module path, the module's call number, the save's number within that
call), which is how a plan finds it again. A region is a module run under selective
checkpointing when its plan recomputes; ``ops`` its ops (the checkpoint's policy sees the same
ones), ``inputs`` the tensors it receives. ``unconstrained_peak_bytes``: the step's peak with
nothing changed (the simulated peak of the plan that keeps every saved tensor:
planner/derived_quantities.hpp). ``kept_saves``: saves of what no decision moves (parameters,
tensors made before the step).

Every reader checks a document first, before anything is built from it: a file from elsewhere (a
lifetime trace passed around a team) is refused with the file, the field, the value and the bound,
never met later as a traceback or a solve that does not end. The checking is the planner's
(planner/file_formats.hpp, Note [Planner files]: the schemas, each bound with its reason, and the
rules across fields; planner/schema.hpp, the walker): it walks the document json.loads made, in
C++, and builds the trace in the same call; a refusal is raised there as stowage.validation's
InputError naming the file and the field. The formats' names, and the bounds Python checks itself
(a grid of sizes, before recording one), are below.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

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

def save_document(document: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(document))


def planner_message(error: ValueError) -> str:
    """A C++ planner's LogicError as a user reads it: without the source location it names."""
    return re.sub(r" \(at [^()]*:\d+\)$", "", str(error))


def load_trace_document(document: Any, where: str) -> Any:
    """A lifetime trace (stowage._core.LifetimeTrace) from its JSON document; InputError (a
    ValueError) naming the file (``where``), the field, the value and the bound for a document
    outside the schema or the trace's rules."""
    return _core.read_plan_file(document, where, LIFETIMES)
