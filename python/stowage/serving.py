"""Which device's memory stowage serves: the one place the package decides it.

stowage serves memory in one of three ways: as torch's CUDA allocator (``stowage.enable()``),
through its C library under torch's CUDAPluggableAllocator (``stowage.c_library_path()``), or as
torch's CPU allocator over a simulated device (CPU mode, ``stowage.enable(device="cpu", ...)``).
The compiled torch integration (``stowage._torch``) knows which; every other module asks here
rather than asking it, so a fourth way would change this file only.

Device indices are stowage's: ``CPU_MODE`` (-1) for CPU mode's simulated device, else the CUDA
device's index.
"""

from __future__ import annotations

from typing import Any

CPU_MODE = -1


def torch_module() -> Any:
    """stowage._torch, checked to be built against the torch installed; RuntimeError saying how
    to fix it otherwise. Imports torch."""
    try:
        # Here: `import stowage` must not import torch (the import hook installs stowage before it).
        import torch  # (loads libc10 for stowage._torch)

        from stowage import _torch
    except ImportError as error:
        raise RuntimeError(
            "stowage's PyTorch integration is not available: install torch, then reinstall "
            f"stowage so it is built against it ({error})"
        ) from error
    if _torch.built_for_torch != torch.__version__:
        raise RuntimeError(
            f"stowage was built against torch {_torch.built_for_torch} but torch "
            f"{torch.__version__} is installed: reinstall stowage (tools/install)"
        )
    return _torch


def serves_cuda(module: Any | None = None) -> bool:
    """Whether stowage serves CUDA memory: as torch's allocator, or through the C library."""
    module = module or torch_module()
    return bool(module.cuda_enabled() or module.cuda_library_in_use())


def is_cuda_allocator(module: Any | None = None) -> bool:
    """Whether stowage is torch's CUDA allocator (torch then keeps history and snapshots)."""
    return bool((module or torch_module()).cuda_enabled())


def is_cpu_allocator(module: Any | None = None) -> bool:
    """Whether stowage is torch's CPU allocator now (CPU mode, not disabled since)."""
    return bool((module or torch_module()).is_enabled())


def was_enabled(module: Any | None = None) -> bool:
    """Whether stowage serves, or has served, any memory in this process."""
    module = module or torch_module()
    return serves_cuda(module) or bool(module.was_enabled())


def enabled_module() -> Any:
    """stowage._torch once stowage serves memory; RuntimeError saying how to enable it otherwise."""
    module = torch_module()
    if not was_enabled(module):
        raise RuntimeError(
            "stowage is not enabled: call stowage.enable() (a GPU) or "
            "stowage.enable(device='cpu', capacity=...) first"
        )
    return module


def device_index(device: Any) -> int:
    """CPU_MODE for "cpu" or whenever stowage serves no CUDA memory, else the CUDA device's index
    (the current device for None). RuntimeError while stowage serves nothing."""
    module = enabled_module()
    if device is not None and str(device) == "cpu":
        return CPU_MODE
    if not serves_cuda(module):
        return CPU_MODE
    import torch  # here: `import stowage` must not import torch

    return int(torch.cuda._get_device_index(device, optional=True))


def serves(device: Any) -> bool:
    """Whether stowage serves the memory of ``device`` (a torch.device) now."""
    if device.type == "cuda":
        return is_cuda_allocator()
    if device.type == "cpu":
        return is_cpu_allocator()
    return False


def memory_cap(device: Any) -> tuple[int, str]:
    """The most stowage may reserve on ``device`` (a torch.device): the smallest of the device's
    memory, the allocator's limit and its memory fraction (which torch's
    set_per_process_memory_fraction sets on a GPU), and which of them holds, as messages name it
    ("the allocator's limit", ...)."""
    cap, bound = enabled_module().memory_cap(device_index(device))
    return int(cap), str(bound)
