"""The lifetime trace of one training step, as ``stowage.plan.profile`` records it and
``stowage plan`` reads it: a JSON file (format ``stowage-lifetimes``, version 1).

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
start: below 0 where the step freed what it began with, such as the last step's gradients) and ``other_bytes`` the part of it that is not a saved tensor; ``io_bytes`` the bytes of its tensor arguments and results
(the work an op's time follows as sizes change, stowage.plan.sizes). A tensor is a storage saved for backward, ``created`` by the op
that produced it; ``packs`` are where autograd saved it: (module path, the module's call number,
the save's number within that call), which is how a plan finds it again. A region is a module run
under selective checkpointing when its plan recomputes; ``ops`` its ops (the checkpoint's policy
sees the same ones), ``inputs`` the tensors it receives. ``unconstrained_peak_bytes``: the step's
peak with nothing changed, as the planner works it out from the trace (the simulated peak of the
plan that keeps every saved tensor, the comparison point "no change": planner/derived_quantities.hpp);
for a recorded step that is its measured peak, the saved tensors being counted in the memory in
use, so files written before hold the same figure. ``kept_saves``: saves of what no decision moves
(parameters, tensors made before the step).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stowage import _core
from stowage.plan.file_formats import LIFETIMES, VERSION

FORMAT = LIFETIMES
PHASES = {"forward": _core.TracePhase.forward, "backward": _core.TracePhase.backward,
           "optimizer": _core.TracePhase.optimizer}


@dataclass
class OpRecord:
    name: str
    module: str
    phase: str
    duration_ms: float
    other_bytes: int = 0
    region: int = -1
    region_op: int = -1
    io_bytes: int = 0
    in_use_bytes: int = 0


@dataclass
class TensorRecord:
    module: str
    bytes: int
    created: int
    last_forward_use: int
    first_backward_use: int
    last_backward_use: int
    recompute_ms: float = 0.0
    recomputable: bool = False
    offloadable: bool = True
    recompute_inputs: list[int] = field(default_factory=list)
    region: int = -1
    packs: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass
class RegionRecord:
    module: str
    call: int
    checkpointable: bool
    ops: list[str]
    inputs: list[int]


@dataclass
class LifetimeTrace:
    """One recorded step, the whole of a lifetime trace file: ops, saved tensors, checkpoint
    regions, the measured cost model and the saves no decision moves. The C++ planner's
    stowage._core.LifetimeTrace (``native_trace()``) is the part of it the planner takes: the ops
    and saved tensors only."""

    ops: list[OpRecord]
    tensors: list[TensorRecord]
    regions: list[RegionRecord]
    cost: dict[str, float]
    unconstrained_peak_bytes: int  # the simulated peak with every saved tensor kept
    kept_saves: list[tuple[str, int, int]] = field(default_factory=list)  # saves no decision moves

    def native_trace(self) -> Any:
        """The trace as the C++ planner takes it (stowage._core.LifetimeTrace)."""
        return native_trace(self.ops, self.tensors)

    def native_cost(self) -> Any:
        return _core.CostModel(float(self.cost["to_host_bytes_per_ms"]),
                               float(self.cost["to_device_bytes_per_ms"]), int(self.cost["prefetch_depth"]))

    def document(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "ops": [asdict(o) for o in self.ops],
                "tensors": [asdict(t) for t in self.tensors], "regions": [asdict(r) for r in self.regions],
                "cost": self.cost, "unconstrained_peak_bytes": self.unconstrained_peak_bytes,
                "kept_saves": self.kept_saves}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.document()))


def native_ops(ops: list[OpRecord]) -> list[Any]:
    """Ops as the C++ planner takes them (stowage._core.TraceOp)."""
    return [_core.TraceOp(o.name, o.module, PHASES[o.phase], o.duration_ms, o.other_bytes, o.region, o.in_use_bytes,
                          o.io_bytes) for o in ops]


def native_trace(ops: list[OpRecord], tensors: list[TensorRecord]) -> Any:
    """Ops and saved tensors as the C++ planner takes them (stowage._core.LifetimeTrace)."""
    trace = _core.LifetimeTrace()
    trace.ops = native_ops(ops)
    trace.tensors = [_core.SavedTensor(t.module, t.bytes, t.created, t.last_forward_use, t.first_backward_use,
                                       t.last_backward_use, t.recompute_ms, t.recomputable, t.offloadable,
                                       t.recompute_inputs, t.region) for t in tensors]
    return trace


def planner_message(error: ValueError) -> str:
    """A C++ planner's LogicError as a user reads it: without the source location it names."""
    return re.sub(r" \(at [^()]*:\d+\)$", "", str(error))


def load_trace_document(document: Any, where: str, field: str = "") -> LifetimeTrace:
    """A lifetime trace from its JSON document; InputError (a ValueError) naming the file (``where``),
    the field, the value and the bound for a document outside stowage.plan.file_formats' schema
    or the trace's rules. ``field``: where the document sits in a larger one."""
    _core.read_lifetimes(document, where, field)
    return trace_of(document)


def trace_of(document: Any) -> LifetimeTrace:
    """The lifetime trace a document holds that stowage.plan.file_formats accepted."""
    return LifetimeTrace(
        ops=[OpRecord(**o) for o in document["ops"]],
        tensors=[TensorRecord(**{**t, "packs": [tuple(p) for p in t.get("packs", ())]}) for t in document["tensors"]],
        regions=[RegionRecord(**r) for r in document["regions"]],
        cost=dict(document["cost"]), unconstrained_peak_bytes=document["unconstrained_peak_bytes"],
        kept_saves=[tuple(p) for p in document.get("kept_saves", [])])
