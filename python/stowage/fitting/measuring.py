"""What `fit` measures for its weighing (Note [Weighing fit's options] in planner/fit_weighing.hpp):
the device's memory (`measure`), what the model's blocks' parameters take (`measure_blocks`), and
how long AdamW's update takes a parameter on the host (stowage's kernel, as the offloaded optimizer
runs it) and on the device (torch's fused AdamW).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from stowage import _core
from stowage.memory import memory_allocated
from stowage.offload.parameters import block_units
from stowage.offload.sharded import local
from stowage.plan.calibration import best_seconds
from stowage.serving import memory_cap, torch_module

# Kept free of the device: the allocator's rounding (pages shared by blocks of different lives
# cannot move; on a small device a few pages are a large share) and torch's own small allocations.
MARGIN_SHARE = 0.05
MARGIN_PAGES = 8
PAGE_BYTES = 2 << 20


def state_copies(optimizer: Any) -> int:
    """Copies of each parameter the optimizer keeps as state: Adam's and AdamW's two moments (three
    with amsgrad), SGD's momentum; two for any other (a guess: give it a budget with room to spare)."""
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if any(g.get("momentum", 0) for g in optimizer.param_groups) else 0
    if isinstance(optimizer, torch.optim.Adam) and any(g.get("amsgrad") for g in optimizer.param_groups):
        return 3
    return 2


def measure(parameters: list[torch.nn.Parameter], in_use: int, capacity: int, copies: int = 2) -> Any:
    """The device's figures (a _core.FitMemory): `parameters` in the optimizer's order (what a share
    keeps follows it); ``in_use``: bytes when fit ran; ``usable``: the capacity less the margin (MARGIN_*)."""
    trainable = [local(p) for p in parameters if p.requires_grad]  # under FSDP2, this rank's shards
    sizes = [p.numel() * p.element_size() for p in trainable]
    return _core.FitMemory(
        usable=max(capacity - max(int(capacity * MARGIN_SHARE), MARGIN_PAGES * PAGE_BYTES), 0), in_use=in_use,
        parameter_count=sum(p.numel() for p in trainable), gradients=sum(sizes), foreach_temporary=sum(sizes),
        largest_parameter=max(sizes, default=0), numels=[local(p).numel() for p in parameters],
        state_bytes=[copies * local(p).numel() * p.element_size() if p.requires_grad else 0 for p in parameters])


def measure_blocks(model: Any, copies: int = 2, cpu_mode: bool = False) -> Any:
    """What the model's blocks' parameters take (a _core.FitBlocks): their bytes, their gradients'
    and states' (``copies`` of each trained parameter), each block's (its path and bytes: how far
    ahead they come in is weighed from them), each parameter once in the totals (tied weights inside
    the blocks are one parameter). ``cpu_mode``: the device is CPU mode's and the factory's optimizer
    stays, so the states torch makes for host parameters count in the device's memory (the
    offloaded twin keeps them in its host store, outside it)."""
    units = block_units(model)
    names = {id(module): name for name, module in model.named_modules()}
    seen: set[int] = set()
    parameter_bytes = gradient_bytes = trained = largest = largest_gradients = 0
    unit_gradients: list[tuple[str, int]] = []  # (module path, its gradients' bytes): as the trace names it
    unit_sizes: list[int] = []
    for unit in units:
        unit_bytes = unit_gradient_bytes = 0
        for param in unit.parameters():
            size = param.numel() * param.element_size()
            unit_bytes += size
            unit_gradient_bytes += size if param.requires_grad else 0
            if id(param) in seen:
                continue
            seen.add(id(param))
            parameter_bytes += size
            if param.requires_grad:
                gradient_bytes += size
                trained += param.numel()
        largest, largest_gradients = max(largest, unit_bytes), max(largest_gradients, unit_gradient_bytes)
        unit_gradients.append((names[id(unit)], unit_gradient_bytes))
        unit_sizes.append(unit_bytes)
    return _core.FitBlocks(units=len(units), parameter_bytes=parameter_bytes, gradient_bytes=gradient_bytes,
                           state_bytes=copies * gradient_bytes, trained_parameters=trained,
                           largest_unit_bytes=largest, largest_unit_gradient_bytes=largest_gradients,
                           unit_bytes=unit_sizes, unit_gradients=unit_gradients, states_counted_on_device=cpu_mode)


def uses_foreach(optimizer: Any) -> bool:
    """Whether torch's optimizer steps through its multi-tensor path (its default on a GPU)."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return False
    if group.get("foreach") is not None:
        return bool(group["foreach"])
    return any(p.is_cuda for g in optimizer.param_groups for p in g["params"])


HOST_PROBE_NUMEL = 1 << 22  # beyond the caches, as the states are
DEVICE_PROBE_NUMEL = (1 << 18, 1 << 24)  # the smallest and largest of the device's larger probe
DEVICE_PROBE_SHARE = 16  # the larger probe's four buffers take at most this share of free memory
HYPER = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _best_ms(run: Callable[[], None], synchronize: Callable[[], None]) -> float:
    run()  # first touches
    synchronize()
    return best_seconds(run, synchronize) * 1e3


def _host_ms(device: torch.device, dtype: torch.dtype) -> float:
    """The host update as the offloaded optimizer runs it for `dtype`: fp32 states for fp32
    parameters, the parameter's own precision for bf16 and fp16 ones (as torch's Adam keeps)."""
    store = torch_module().HostStateStore(str(device))  # pinned host memory, not the device's
    narrow = dtype in (torch.bfloat16, torch.float16)
    state = dtype if narrow else torch.float32
    master, grad = store.empty(HOST_PROBE_NUMEL, state), store.empty(HOST_PROBE_NUMEL, dtype)
    moments = [store.empty(HOST_PROBE_NUMEL, state).zero_() for _ in range(2)]
    master.fill_(1.0), grad.fill_(1e-3)
    threads = len(torch_module().cpus_near(""))  # every CPU the process may use
    steps = iter(range(1, 1 << 30))
    beta1, beta2 = HYPER["betas"]
    hyper = dict(lr=HYPER["lr"], beta1=beta1, beta2=beta2, eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                 threads=threads)
    module = torch_module()

    def run() -> None:
        if narrow:
            module.adam_update_narrow(master, *moments, grad, next(steps), **hyper)
        else:
            module.adamw_update(master, *moments, grad, None, next(steps), **hyper)

    return _best_ms(run, lambda: None)


def _device_ms(device: torch.device, dtype: torch.dtype, numel: int) -> float:
    parameter = torch.nn.Parameter(torch.ones(numel, device=device, dtype=dtype))
    parameter.grad = torch.full_like(parameter, 1e-3)
    try:
        optimizer = torch.optim.AdamW([parameter], fused=True, **HYPER)  # type: ignore[arg-type]
    except RuntimeError:  # no fused AdamW for this device or dtype
        optimizer = torch.optim.AdamW([parameter], **HYPER)  # type: ignore[arg-type]
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return _best_ms(optimizer.step, synchronize)


def _device_ms_per_parameter(device: torch.device, dtype: torch.dtype) -> float:
    """The time a parameter adds to the device's step: the slope between a probe and one four times
    its size (never below the larger's time over its size), not one probe's time over its size: a
    fused step's fixed cost (the launch: about 0.1 ms on a GPU) would make a GPU's update look
    several times slower than the host's (bench/results/2026-11-26-h200-gpu.md)."""
    free = memory_cap(device)[0] - int(memory_allocated(device))
    per_parameter = 2 * dtype.itemsize + 2 * 4  # parameter and gradient, fp32 moments
    smallest, largest = DEVICE_PROBE_NUMEL
    large = max(smallest * 4, min(largest, free // DEVICE_PROBE_SHARE // per_parameter))
    small = large // 4
    large_ms = _device_ms(device, dtype, large)
    slope = (large_ms - _device_ms(device, dtype, small)) / (large - small)
    return slope if slope > 0 else large_ms / large


def measure_rates(device: torch.device, dtype: torch.dtype) -> Any:
    """Both rates (a _core.UpdateRates); a device too full for the probes is taken as fast as the host."""
    host = _host_ms(device, dtype) / HOST_PROBE_NUMEL
    try:
        on_device = _device_ms_per_parameter(device, dtype)
    except torch.OutOfMemoryError:
        on_device = host
    return _core.UpdateRates(host, on_device)
