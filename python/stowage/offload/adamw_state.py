"""Moving stowage.offload.AdamW's states in and out of torch.optim.AdamW's state_dict format.

A parameter's entry is torch's: ``step`` (a float32 scalar tensor), ``exp_avg`` and
``exp_avg_sq`` (the parameter's shape; fp32 here, whatever the parameter's dtype). A parameter
that is not fp32 adds its fp32 master weights under ``master``; a checkpoint without them (one
torch's AdamW wrote) starts the masters from the parameters as they are when it is loaded, so
load the model's weights first.
"""

from __future__ import annotations

from typing import Any

import torch

from stowage.offload.adamw_buckets import Slot
from stowage.offload.sharded import local


def _copy_checked(destination: torch.Tensor, value: Any, key: str, param: torch.Tensor) -> None:
    if not isinstance(value, torch.Tensor) or local(value).numel() != destination.numel():
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"loaded state's {key!r} for a parameter of shape {tuple(param.shape)} is {got}")
    destination.copy_(local(value.detach()).reshape(destination.shape))


def load_offloaded_state(slot: Slot, saved: dict[str, Any] | None) -> None:
    """Fills `slot`'s host states from one parameter's saved entry (None: a fresh state)."""
    param = slot.param
    shard = local(param)
    if not saved:
        slot.exp_avg.zero_()
        slot.exp_avg_sq.zero_()
        slot.step.zero_()
        slot.master.copy_(shard.detach())
    else:
        for key in ("exp_avg", "exp_avg_sq"):
            if key not in saved:
                raise ValueError(f"loaded state for a parameter of shape {tuple(param.shape)} has no {key!r} "
                                 "(is it an AdamW state dict?)")
            _copy_checked(getattr(slot, key), saved[key], key, param)
        step = saved.get("step", 0)
        slot.step.fill_(float(step.item() if isinstance(step, torch.Tensor) else step))
        if "master" in saved and param.dtype != torch.float32:
            _copy_checked(slot.master, saved["master"], "master", param)
        else:
            slot.master.copy_(shard.detach())
    slot.param_version = shard._version


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
