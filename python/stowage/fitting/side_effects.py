"""What fit's own steps (recording, the cut check, trials) must not leave behind: training after
`fit` starts exactly where it would have without it.

Contract: on leaving ``untouched(model, device)`` (raised or not) every buffer holds its bytes from
before (BatchNorm's running statistics), the CPU's and device's generators their states, each
parameter its gradient and each module its mode.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from stowage.serving import device_index, torch_module


@contextlib.contextmanager
def untouched(model: Any, device: torch.device) -> Iterator[None]:
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    gradients = [(param, param.grad) for param in model.parameters()]
    for param in model.parameters():
        param.grad = None  # put aside: the recorded step's own gradients go to fresh tensors
    modes = [(module, module.training) for module in model.modules()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for param, grad in gradients:
            param.grad = grad
        for module, training in modes:
            module.training = training
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


@contextlib.contextmanager
def fit_trial(device: torch.device) -> Iterator[None]:
    """fit's own steps, marked in the device's history (stowage.fit.trial_begin / trial_end) so that
    an inspection tells them from training (an out-of-memory while recording is fit's)."""
    module, index = torch_module(), device_index(device)
    module.mark_fit_trial(True, index)
    try:
        yield
    finally:
        module.mark_fit_trial(False, index)
