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

import math
from typing import Any

import torch

from stowage.offload.adam_buckets import Slot
from stowage.offload.sharded import local

MAX_STEP = 2 ** 53  # the largest count a step holds exactly as a float64 (torch keeps float32)


def describe_parameter(param_groups: list[dict[str, Any]], param: torch.Tensor) -> str:
    """'parameter 3 (group 0, shape [64, 24])': its index as state_dicts number it."""
    index = 0
    for number, group in enumerate(param_groups):
        for candidate in group["params"]:
            if candidate is param:
                return f"parameter {index} (group {number}, shape {list(param.shape)})"
            index += 1
    return f"a parameter of shape {list(param.shape)}"


def _refuse(where: str, problem: str) -> ValueError:
    return ValueError(f"{where}: {problem}")


def _check_step(value: Any, where: str) -> None:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise _refuse(where, f"'step' has {value.numel()} elements; a step count is one number")
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _refuse(where, f"'step' is a {type(value).__name__}; a step count is a number")
    if not math.isfinite(value) or value < 0 or value != int(value) or value > MAX_STEP:
        raise _refuse(where, f"'step' is {value!r}; a step count is a whole number from 0 to 2**53")


def _check_moment(entry: dict[str, Any], key: str, numel: int, where: str) -> None:
    value = entry.get(key)
    if not isinstance(value, torch.Tensor):
        raise _refuse(where, f"no tensor {key!r} (got {type(value).__name__}; is it an Adam state dict?)")
    if not value.is_floating_point() or value.is_sparse:
        raise _refuse(where, f"{key!r} is a {value.dtype} tensor; Adam's states are dense floating point")
    if local(value).numel() != numel:
        raise _refuse(where, f"{key!r} has {local(value).numel()} elements where the parameter has {numel}")
    if key != "exp_avg" and bool((local(value.detach()) < 0).any()):
        raise _refuse(where, f"{key!r} holds negative values; a second moment is a mean of squares")


def _check_entry(entry: Any, param: torch.Tensor, amsgrad: bool, where: str) -> None:
    if not isinstance(entry, dict):
        raise _refuse(where, f"its state is a {type(entry).__name__}, not a dict")
    numel = local(param).numel()
    _check_step(entry.get("step", 0), where)
    for key in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ()):
        _check_moment(entry, key, numel, where)
    master = entry.get("master")
    if master is not None and (not isinstance(master, torch.Tensor) or local(master).numel() != numel):
        raise _refuse(where, f"'master' is not a tensor of the parameter's {numel} elements")


def _check_group(ours: dict[str, Any], saved: Any, number: int, where: str) -> None:
    if not isinstance(saved, dict) or not isinstance(saved.get("params"), list):
        raise _refuse(where, f"param group {number} is not a dict with a 'params' list")
    if len(saved["params"]) != len(ours["params"]):
        raise _refuse(where, f"param group {number} has {len(saved['params'])} parameters where this optimizer's "
                             f"has {len(ours['params'])}")
    betas = saved.get("betas", ours["betas"])
    numbers = {"lr": saved.get("lr", ours["lr"]), "eps": saved.get("eps", ours["eps"]),
               "weight_decay": saved.get("weight_decay", ours["weight_decay"])}
    for key, value in numbers.items():
        value = float(value) if isinstance(value, (int, float, torch.Tensor)) else float("nan")
        if not math.isfinite(value) or value < 0:
            raise _refuse(where, f"param group {number}'s {key} is {numbers[key]!r}; it must be a number >= 0")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(0 <= float(b) < 1 for b in betas)):
        raise _refuse(where, f"param group {number}'s betas are {betas!r}; two numbers in [0, 1)")
    if bool(saved.get("amsgrad", ours["amsgrad"])) != bool(ours["amsgrad"]):
        raise _refuse(where, f"param group {number} was saved with amsgrad={saved.get('amsgrad')!r}; make the "
                             f"optimizer with amsgrad={saved.get('amsgrad')!r} to load it")


def check_loadable(param_groups: list[dict[str, Any]], state_dict: Any, owner: str) -> dict[torch.Tensor, Any]:
    """Checks a whole state_dict against this optimizer's groups before anything is taken from it;
    returns each parameter's saved entry (None where it has none). Raises ValueError naming the
    parameter and the field."""
    where = f"stowage.offload.{owner}.load_state_dict"
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list) \
            or not isinstance(state_dict.get("state"), dict):
        raise _refuse(where, "not an optimizer state_dict (a dict with 'state' and 'param_groups')")
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(param_groups):
        raise _refuse(where, f"the state_dict has {len(saved_groups)} param groups where this optimizer has "
                             f"{len(param_groups)} (loaded state dict's parameter groups do not match)")
    by_param: dict[torch.Tensor, Any] = {}
    for number, (ours, saved) in enumerate(zip(param_groups, saved_groups)):
        _check_group(ours, saved, number, where)
        for param, key in zip(ours["params"], saved["params"]):
            entry = state_dict["state"].get(key)
            if entry:
                _check_entry(entry, param, bool(ours["amsgrad"]),
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
