"""The copy bandwidth each way between the device and pinned host memory, measured on this
machine: a short calibration for the planner's cost model (``CostModel``), overridable in
``stowage.plan.solve``.

On a GPU: copies of a 64 MiB buffer (smaller on a device too full for it, down to 1 MiB) between the device and pinned host memory, each way, the
best of a few. In CPU mode: a round trip of a tensor through the offload engine's offloader (out to
host memory and back), which runs at the simulated link's speed, counted half each way.
"""

from __future__ import annotations

import time
from typing import Any

from stowage.serving import torch_module

CALIBRATION_BYTES = 64 << 20
SMALLEST_CALIBRATION_BYTES = 1 << 20
PREFETCH_DEPTH = 2


def best_seconds(copy: Any, synchronize: Any, repeats: int = 3) -> float:
    """The shortest of `repeats` runs of `copy`, each timed between two `synchronize` calls."""
    best = float("inf")
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        copy()
        synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def measure_cost(device: Any) -> dict[str, float]:
    """The cost model for `device` ("cpu" for CPU mode), in bytes per millisecond: measured on
    the largest buffer up to CALIBRATION_BYTES the device has room for."""
    import torch  # here: stowage plan (the command) imports this module, and must not import torch

    size = CALIBRATION_BYTES
    while True:
        try:
            return _measure_at(device, size)
        except torch.OutOfMemoryError:
            if size <= SMALLEST_CALIBRATION_BYTES:
                raise
            size //= 4


def _measure_at(device: Any, size: int) -> dict[str, float]:
    import torch  # as in measure_cost

    count = size // 4
    if torch.device(device).type == "cuda":
        on_device = torch.empty(count, dtype=torch.float32, device=device)
        pinned = torch.empty(count, dtype=torch.float32, pin_memory=True)
        sync = torch.cuda.synchronize
        to_host = best_seconds(lambda: pinned.copy_(on_device, non_blocking=True), sync)
        to_device = best_seconds(lambda: on_device.copy_(pinned, non_blocking=True), sync)
    else:
        module = torch_module()
        module.offload_configure(0, size)
        tensor = torch.ones(count, dtype=torch.float32)

        def round_trip() -> None:
            packed = module.TensorOffloader(0).pack(tensor)
            module.TensorOffloader.unpack(packed)

        to_host = to_device = best_seconds(round_trip, lambda: None) / 2
        module.offload_end_step()
    return {"to_host_bytes_per_ms": size / (to_host * 1e3),
            "to_device_bytes_per_ms": size / (to_device * 1e3),
            "prefetch_depth": PREFETCH_DEPTH}
