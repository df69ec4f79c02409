"""From a recorded step to its lifetime trace: saved storages grouped by the op that made them
(selective checkpointing saves or recomputes per op, so one op's outputs share a decision), their
lifetimes, which can be recomputed in which checkpoint region, and each op's memory besides them.

The rules (each what the runtime can apply, Note [Lifetime trace] in planner/):
- a saved storage made before the step (a batch, a parameter) is not in the trace: no decision
  frees it;
- a tensor is in region r when its op ran in block r and some save of it happened there; it can
  be recomputed when every save of it happened in r and r can be checkpointed; a block can be
  checkpointed when it ran once and each tensor it receives is saved within it (so running it
  under a checkpoint, which keeps its inputs, adds nothing);
- recomputing a region reruns its ops up to its last saved tensor's: each tensor's recompute
  time is its op's and those of the ops since the region's previous saved tensor, and it needs
  the region's inputs back first.
"""

from __future__ import annotations

from typing import Any

from stowage.plan.lifetimes import LifetimeProfile, OpRecord, TensorRecord, native_trace


def _units(recorder: Any) -> dict[int, TensorRecord]:
    """Saved storages grouped by producing op (key: the op's index)."""
    units: dict[int, TensorRecord] = {}
    for key, saved in recorder.saved.items():
        if not _in_trace(recorder, key):
            continue
        created = recorder.producer[key]
        last_forward = max([recorder.last_forward.get(key, created), *saved.save_ops])
        last_backward = max(saved.last_backward or saved.first_backward, saved.first_backward)
        region = recorder.ops[created].region
        unit = units.get(created)
        if unit is None:
            unit = units[created] = TensorRecord(recorder.ops[created].module, 0, created, last_forward,
                                                 saved.first_backward, last_backward, recomputable=True)
        unit.bytes += saved.bytes
        unit.last_forward_use = max(unit.last_forward_use, last_forward)
        unit.first_backward_use = min(unit.first_backward_use, saved.first_backward)
        unit.last_backward_use = max(unit.last_backward_use, last_backward)
        unit.packs.extend(saved.saves)
        if region >= 0 and region in saved.save_regions:
            unit.region = region
        unit.recomputable = unit.recomputable and region >= 0 and saved.save_regions == {region}
    for unit in units.values():
        unit.packs.sort()  # saves in one order, whatever the order of the storages' addresses
    return units


def _link_regions(recorder: Any, ordered: list[TensorRecord], index_of_op: dict[int, int]) -> None:
    """Marks blocks that cannot be checkpointed, and gives each recomputable tensor its region's
    inputs."""
    regions = recorder.regions
    calls: dict[str, int] = {}
    for region in regions:
        calls[region.module] = calls.get(region.module, 0) + 1
    for r, region in enumerate(regions):
        inputs = []
        for key in recorder.region_inputs[r]:
            op = recorder.producer.get(key)
            saved = recorder.saved.get(key)
            if op is None or op not in index_of_op or saved is None or r not in saved.save_regions:
                region.checkpointable = False
                break
            inputs.append(index_of_op[op])
        region.inputs = inputs  # per tensor argument, in order
        region.checkpointable = region.checkpointable and calls[region.module] == 1
    for unit in ordered:
        if unit.region < 0:
            continue
        region = regions[unit.region]
        unit.recomputable = unit.recomputable and region.checkpointable
        if region.checkpointable:
            unit.recompute_inputs = sorted({i for i in region.inputs if ordered[i].created < unit.created})
        else:
            unit.region = -1  # never checkpointed: its saves reach the pager


def _derive(ops: list[OpRecord], tensors: list[TensorRecord]) -> None:
    """Each op's memory besides the saved tensors live during it, and each region tensor's
    recompute time, as the planner derives them (planner/derived_quantities.hpp)."""
    trace = native_trace(ops, tensors)
    trace.derive_other_bytes()
    trace.derive_recompute_times()
    for op, native in zip(ops, trace.ops):
        op.other_bytes = native.other_bytes
    for tensor, native in zip(tensors, trace.tensors):
        tensor.recompute_ms = native.recompute_ms


def _in_trace(recorder: Any, key: int) -> bool:
    saved = recorder.saved[key]
    created = recorder.producer.get(key)
    return created is not None and saved.first_backward is not None and saved.first_backward < len(recorder.ops)


def build_profile(recorder: Any, cost: dict[str, float]) -> LifetimeProfile:
    units = _units(recorder)
    ordered = [units[op] for op in sorted(units)]
    index_of_op = {unit.created: i for i, unit in enumerate(ordered)}
    for op, in_use in zip(recorder.ops, recorder.peaks):
        op.in_use_bytes = in_use  # below 0 where the step freed what it began with (last step's gradients)
    _derive(recorder.ops, ordered)  # with the regions as recorded, before _link_regions drops some
    _link_regions(recorder, ordered, index_of_op)
    peak = max(recorder.peaks, default=0)
    elsewhere = recorder.elsewhere + [save for key, saved in recorder.saved.items()
                                      if not _in_trace(recorder, key) for save in saved.saves]
    profile = LifetimeProfile(recorder.ops, ordered, recorder.regions, cost, max(0, peak), elsewhere)
    profile.native_trace().validate()
    return profile
