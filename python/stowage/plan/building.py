"""From a recorded step to its lifetime trace: the recorder's ledger (planner/step_ledger.hpp)
handed to the planner, which applies the rules (Note [Building a trace] in
planner/trace_builder.hpp: saved storages grouped by the op that made them, their lifetimes,
which can be recomputed in which checkpoint region, each op's memory besides them), and its
trace read back into the lifetime trace's records with where each
tensor was saved (the keys a plan finds it by).
"""

from __future__ import annotations

from typing import Any

from stowage import _core
from stowage.plan.lifetimes import LifetimeTrace, TensorRecord, native_ops


def build_trace(recorder: Any, cost: dict[str, float]) -> LifetimeTrace:
    for op, in_use in zip(recorder.ops, recorder.peaks):
        op.in_use_bytes = in_use  # below 0 where the step freed what it began with (last step's gradients)
    regions = []
    for region in recorder.regions:
        native = _core.RecordedRegion()
        native.module, native.checkpointable = region.module, region.checkpointable
        regions.append(native)
    built = _core.build_trace(recorder.ledger.recording(native_ops(recorder.ops), regions))
    order = recorder.ledger.storage_order()  # the recording's storages, as the ledger numbers them
    for op, native in zip(recorder.ops, built.trace.ops):
        op.other_bytes = native.other_bytes
    tensors = []
    for native, storages in zip(built.trace.tensors, built.storages_of_tensor):
        packs = sorted(site for s in storages for site in recorder.sites[order[s]])  # whatever the addresses' order
        tensors.append(TensorRecord(native.module, native.bytes, native.created, native.last_forward_use,
                                    native.first_backward_use, native.last_backward_use, native.recompute_ms,
                                    native.recomputable, native.offloadable, list(native.recompute_inputs),
                                    native.region, packs))
    for region, checkpointable, inputs in zip(recorder.regions, built.region_checkpointable, built.region_inputs):
        region.checkpointable, region.inputs = checkpointable, list(inputs)  # inputs: per tensor argument, in order
    elsewhere = recorder.elsewhere + [site for s in built.left_out for site in recorder.sites[order[s]]]
    return LifetimeTrace(recorder.ops, tensors, recorder.regions, cost, built.unconstrained_peak_bytes, elsewhere)
