"""The offloaded Adam's host-side layout as numbers (Note [Optimizer buckets],
offload/adam_buckets.hpp, which plans the buckets that python/bindings/torch/adam_slots.hpp lays
out in host memory): the device share and what a parameter costs in host memory, which fit's
accounting reads too."""

from __future__ import annotations

from typing import Sequence

import torch

from stowage.serving import torch_module

DEFAULT_BUCKET_NUMEL = 1 << 24  # 16 M parameters: 448 MB of traffic per update


def kept_on_device(numels: Sequence[int], fraction: float) -> int:
    """How many of the first parameters (in the optimizer's order) keep their states on the
    device for `fraction` of the parameters by count (offload/adam_buckets.hpp)."""
    return int(torch_module().kept_on_device(list(numels), fraction))


def bytes_per_parameter(dtype: torch.dtype, grad_buffers: int, amsgrad: bool = False,
                        master_weights: bool = False) -> int:
    """Host bytes one offloaded parameter takes: master, moments (and amsgrad's maximum), the
    gradient staging buffers and, with fp32 masters of a parameter that is not fp32, an output
    buffer (offload/adam_buckets.hpp)."""
    return int(torch_module().bytes_per_parameter(dtype, grad_buffers, amsgrad, master_weights))
