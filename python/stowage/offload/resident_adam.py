"""The offloaded optimizer's part for parameters that stowage.offload.parameters keeps on the host
(README's "Parameters off the device"): each is updated in place where it lives, from its host
``.grad``, by stowage's host kernel (offload/adamw_kernel.hpp), with no copy and no staging. Its
states are torch's state entry (step, exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad, and the
fp32 master where the host keeps one), held on the host: a slot's views of its bucket where the
offloaded optimizer keeps the parameter's states there, or host tensors this part makes (or takes
from the device share) for a parameter of the device share.

Contract: used from the optimizer's thread, under its lock; holds nothing but what it is handed and
the host tensors it makes; an update either runs whole or raises before anything changed
(arguments are checked first).
"""

from __future__ import annotations

from typing import Any

import torch

from stowage.serving import torch_module

NARROW = (torch.bfloat16, torch.float16)


class ResidentUpdate:
    """Updates host-resident parameters in place (one call per parameter, split over `threads`
    CPUs), as torch's Adam / AdamW would on the device: `cpu_sqrt` takes the CPU's square root
    (the reference optimizer runs on a CPU: CPU mode), else the correctly rounded one (CUDA's)."""

    def __init__(self, device: str, threads: int, cpu_sqrt: bool) -> None:
        self._store = torch_module().HostStateStore(device)  # pinned where the device is a GPU
        self._threads = max(int(threads), 1)
        self._cpu_sqrt = cpu_sqrt

    def fresh_states(self, param: torch.Tensor, amsgrad: bool) -> dict[str, Any]:
        """Zero states for `param` as torch's Adam makes them at its first step: moments in the
        parameter's dtype, the step count a float32 scalar."""
        entry: dict[str, Any] = {"step": torch.zeros((), dtype=torch.float32)}
        for name in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ()):
            entry[name] = self._host_zeros(param)
        return entry

    def to_host(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A copy of a device share's state entry in host memory (the step count as it is)."""
        moved: dict[str, Any] = {}
        for name, value in entry.items():
            if name == "step" or not isinstance(value, torch.Tensor):
                moved[name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
            else:
                moved[name] = self._host_zeros(value)
                moved[name].copy_(value)
        return moved

    @staticmethod
    def to_device(entry: dict[str, Any], device: torch.device, step_on_device: bool) -> dict[str, Any]:
        """`entry` copied back to `device` (CPU mode's too: a new tensor, not the host one), the
        step count there too where `step_on_device` (torch's fused and capturable steps keep it on
        the parameter's device), else as it is."""
        moved: dict[str, Any] = {}
        for name, value in entry.items():
            if not isinstance(value, torch.Tensor) or (name == "step" and not step_on_device):
                moved[name] = value
            else:
                moved[name] = torch.empty_like(value, device=device).copy_(value)
        return moved

    def _host_zeros(self, like: torch.Tensor) -> torch.Tensor:
        return self._store.empty(like.numel(), like.dtype).view(like.shape).zero_()

    @staticmethod
    def refusal(param: torch.Tensor, grad: torch.Tensor) -> str:
        """Why `param` (its ``.data``) and `grad` cannot be updated in place on the host ("" when
        they can): both dense host tensors of one shape, the parameter contiguous."""
        if grad.is_sparse or grad.layout != torch.strided:
            return "its gradient is sparse; the host update takes dense ones"
        if param.device.type != "cpu" or not param.is_contiguous():
            return (f"its .data was replaced by a tensor on {param.device} (or a strided view) since its last "
                    "forward, which would take it into host memory: write into it in place (p.data.copy_(t)), "
                    "or run a forward first")
        if grad.device.type != "cpu" or grad.shape != param.shape:
            return (f"its gradient is on {grad.device} with shape {list(grad.shape)}, not a host tensor of the "
                    f"parameter's shape {list(param.shape)}")
        return ""

    def update(self, param: torch.Tensor, grad: torch.Tensor, entry: dict[str, Any], group: dict[str, Any],
               grad_scale: float) -> None:
        """One step of `param` (host memory; `refusal` empty) from `grad` (host memory, `grad_scale`
        applied as it is read) over `entry`, the param group's options; the step count goes up by
        one. With an fp32 master (``entry["master"]``) the parameter is written from it in its own
        precision."""
        beta1, beta2 = group["betas"]
        hyper = dict(lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2), eps=float(group["eps"]),
                     weight_decay=float(group["weight_decay"]), grad_scale=grad_scale, threads=self._threads,
                     decoupled_weight_decay=bool(group.get("decoupled_weight_decay", False)),
                     maximize=bool(group.get("maximize", False)),
                     max_exp_avg_sq=entry.get("max_exp_avg_sq") if group.get("amsgrad") else None)
        step = int(entry["step"].item()) + 1
        module = torch_module()
        master = entry.get("master")
        if master is not None:
            module.adamw_update(master, entry["exp_avg"], entry["exp_avg_sq"], grad.detach(), param.detach(), step,
                                cpu_sqrt=self._cpu_sqrt, **hyper)
        elif param.dtype in NARROW:
            module.adam_update_narrow(param.detach(), entry["exp_avg"], entry["exp_avg_sq"], grad.detach(), step,
                                      **hyper)
        else:
            module.adamw_update(param.detach(), entry["exp_avg"], entry["exp_avg_sq"], grad.detach(), None, step,
                                cpu_sqrt=self._cpu_sqrt, **hyper)
        entry["step"].fill_(step)
