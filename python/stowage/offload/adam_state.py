"""Moving stowage.offload.Adam's states in and out of torch.optim.Adam's state_dict format, and
checking a state_dict whole before any of it is taken.

A parameter's entry is torch's: ``step`` (a float32 scalar tensor), ``exp_avg`` and
``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad) in the parameter's shape and in the states'
precision (the parameter's, or fp32 with master_weights). With master_weights a parameter that is
not fp32 adds its fp32 master weights under ``master``; a checkpoint without them (one torch's
optimizer wrote) starts the masters from the parameters as they are when it is loaded, so load
the model's weights first.
"""

from __future__ import annotations

from typing import Any

import torch

from stowage.serving import torch_module
from stowage.offload.adam_buckets import Slot
from stowage.offload.sharded import local

def describe_parameter(param_groups: list[dict[str, Any]], param: torch.Tensor) -> str:
    """'parameter 3 (group 0, shape [64, 24])': its index as state_dicts number it."""
    index = 0
    for number, group in enumerate(param_groups):
        for candidate in group["params"]:
            if candidate is param:
                return f"parameter {index} (group {number}, shape {list(param.shape)})"
            index += 1
    return f"a parameter of shape {list(param.shape)}"


def check_loadable(param_groups: list[dict[str, Any]], state_dict: Any, owner: str) -> dict[torch.Tensor, Any]:
    """Checks a whole state_dict against this optimizer's groups before anything is taken from it
    (each group and entry by python/bindings/torch/adam_state_check.cpp); returns each parameter's
    saved entry (None where it has none). Raises ValueError naming the parameter and the field."""
    where = f"stowage.offload.{owner}.load_state_dict"
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list) \
            or not isinstance(state_dict.get("state"), dict):
        raise ValueError(f"{where}: not an optimizer state_dict (a dict with 'state' and 'param_groups')")
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(param_groups):
        raise ValueError(f"{where}: the state_dict has {len(saved_groups)} param groups where this optimizer has "
                         f"{len(param_groups)} (loaded state dict's parameter groups do not match)")
    module = torch_module()
    by_param: dict[torch.Tensor, Any] = {}
    for number, (ours, saved) in enumerate(zip(param_groups, saved_groups)):
        module.check_adam_group(ours, saved, number, where)
        for param, key in zip(ours["params"], saved["params"]):
            entry = state_dict["state"].get(key)
            if entry:
                local_entry = {k: local(v) if isinstance(v, torch.Tensor) else v for k, v in entry.items()} \
                    if isinstance(entry, dict) else entry
                module.check_adam_entry(local_entry, local(param).numel(), bool(ours["amsgrad"]),
                                        f"{where}: {describe_parameter(param_groups, param)}")
            by_param[param] = entry or None
    return by_param


def _copy_into(destination: torch.Tensor, value: torch.Tensor) -> None:
    destination.copy_(local(value.detach()).reshape(destination.shape))


def load_offloaded_state(slot: Slot, saved: dict[str, Any] | None) -> None:
    """Fills `slot`'s host states from one parameter's checked entry (None: a fresh state)."""
    shard = local(slot.param)
    moments = [slot.exp_avg, slot.exp_avg_sq] + ([slot.max_exp_avg_sq] if slot.max_exp_avg_sq is not None else [])
    if not saved:
        for moment in moments:
            moment.zero_()
        slot.step.zero_()
        slot.master.copy_(shard.detach())
        return
    for moment, key in zip(moments, ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")):
        _copy_into(moment, saved[key])
    step = saved.get("step", 0)
    slot.step.fill_(float(step.item() if isinstance(step, torch.Tensor) else step))
    if saved.get("master") is not None and slot.master.dtype != slot.param.dtype:
        _copy_into(slot.master, saved["master"])
    else:
        slot.master.copy_(shard.detach())


def split_device_state(inner: torch.optim.Optimizer, by_param: dict[torch.Tensor, Any]) -> dict[str, Any]:
    """The state dict for the optimizer that keeps states on the device, in its own numbering,
    from the saved entries of its parameters (hyper-parameters as it has them now)."""
    state: dict[int, Any] = {}
    groups = []
    index = 0
    for group in inner.param_groups:
        ids = []
        for param in group["params"]:
            saved = by_param.get(param)
            if saved:
                state[index] = {k: v for k, v in saved.items() if k != "master"}
            ids.append(index)
            index += 1
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
    return {"state": state, "param_groups": groups}
