"""From a recorded step to its lifetime trace: the recorder's figures handed to the planner, which
applies the rules (Note [Building a trace] in planner/trace_builder.hpp: saved storages grouped by
the op that made them, their lifetimes, which can be recomputed in which checkpoint region, each
op's memory besides them), and its trace read back into the profile's records with where each
tensor was saved (the keys a plan finds it by).
"""

from __future__ import annotations

from typing import Any

from stowage import _core
from stowage.plan.lifetimes import LifetimeProfile, TensorRecord, native_trace


def _recording(recorder: Any, keys: list[int]) -> Any:
    """The recorder's step as the planner takes it; storages in the order of `keys`."""
    recording = _core.StepRecording()
    recording.ops = native_trace(recorder.ops, []).ops
    storages = []
    for key in keys:
        saved = recorder.saved[key]
        storage = _core.RecordedStorage()
        storage.bytes, storage.producer = saved.bytes, recorder.producer.get(key)
        storage.last_forward = recorder.last_forward.get(key)
        # A last backward use at op 0 is none (no backward op is the step's first).
        storage.first_backward, storage.last_backward = saved.first_backward, saved.last_backward or None
        storage.save_ops, storage.save_regions = saved.save_ops, sorted(saved.save_regions)
        storages.append(storage)
    index = {key: i for i, key in enumerate(keys)}
    regions = []
    for region, inputs in zip(recorder.regions, recorder.region_inputs):
        native = _core.RecordedRegion()
        native.module, native.checkpointable = region.module, region.checkpointable
        native.inputs = [index.get(key, -1) for key in inputs]
        regions.append(native)
    recording.storages, recording.regions = storages, regions
    return recording


def build_profile(recorder: Any, cost: dict[str, float]) -> LifetimeProfile:
    for op, in_use in zip(recorder.ops, recorder.peaks):
        op.in_use_bytes = in_use  # below 0 where the step freed what it began with (last step's gradients)
    keys = list(recorder.saved)
    built = _core.build_trace(_recording(recorder, keys))
    for op, native in zip(recorder.ops, built.trace.ops):
        op.other_bytes = native.other_bytes
    tensors = []
    for native, storages in zip(built.trace.tensors, built.storages_of_tensor):
        packs = sorted(save for s in storages for save in recorder.saved[keys[s]].saves)  # whatever the addresses' order
        tensors.append(TensorRecord(native.module, native.bytes, native.created, native.last_forward_use,
                                    native.first_backward_use, native.last_backward_use, native.recompute_ms,
                                    native.recomputable, native.offloadable, list(native.recompute_inputs),
                                    native.region, packs))
    for region, checkpointable, inputs in zip(recorder.regions, built.region_checkpointable, built.region_inputs):
        region.checkpointable, region.inputs = checkpointable, list(inputs)  # inputs: per tensor argument, in order
    elsewhere = recorder.elsewhere + [save for s in built.left_out for save in recorder.saved[keys[s]].saves]
    return LifetimeProfile(recorder.ops, tensors, recorder.regions, cost, built.unconstrained_peak_bytes, elsewhere)
