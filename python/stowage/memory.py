"""The memory API: stowage's counterpart of torch.cuda's memory functions (README: "CPU mode and
the memory API").

The names and meanings follow torch.cuda (memory_stats keys, memory_summary's layout, the
snapshot dict), so code and tools written for one read the other. On a GPU, stowage is torch's
CUDA allocator, and torch.cuda's own functions report the same figures (stowage.memory_stats()
adds stowage's keys); in CPU mode stowage is torch's CPU allocator over a simulated device of a
chosen capacity, with the same API. Tensors allocated before enable() keep their old allocator
and are freed by it; tensors from stowage stay valid after disable().
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any

from stowage import _core, checking, tagging
from stowage.byte_counts import MAX_BYTE_COUNT, in_range
from stowage.offload import summary_lines
from stowage.serving import (CPU_MODE, device_index, enabled_module, is_cpu_allocator, is_cuda_allocator, torch_module,
                             was_enabled)

DEFAULT_MAX_ENTRIES = 100_000


MIN_CAPACITY = 2 << 20  # one page of the simulated device (its granularity): no device is smaller
MAX_CAPACITY = 2**50  # the simulated device's largest (HostBackend::kMaxCapacity)
MIN_COPY_BANDWIDTH = 10_000_000  # 10 MB/s: the floor of stowage's waits (Note [Bounded waits])
MAX_COPY_BANDWIDTH = 10**15


def enable(conf: str | None = None, *, device: str = "cuda", capacity: int | str | None = None,
           copy_bandwidth: int | str | None = None, pinned_limit: int | str | None = None,
           check: bool | None = None) -> None:
    """Makes stowage the allocator of ``device``.

    ``conf`` is the ``key:value,key:value`` allocator configuration (as STOWAGE_ALLOC_CONF).
    device="cuda" makes stowage torch's CUDA allocator; it must come before CUDA is initialised
    (the first CUDA tensor), as setting STOWAGE_ALLOC_CONF does by itself.
    device="cpu" installs stowage as torch's CPU allocator over a simulated device of
    ``capacity`` bytes ("4GiB" or an int); CPU tensors allocated afterwards count against it.
    In CPU mode, ``copy_bandwidth`` (bytes per second, e.g. "25GB") is the speed of the simulated
    link between the device and host memory that offloaded tensors cross (default: as fast as
    memory copies), and ``pinned_limit`` the host memory the device will pin (as ``ulimit -l``;
    default: any), beyond which offloaded tensors go to pageable memory.
    ``check=True`` turns on check mode (stowage.checking, as STOWAGE_CHECK=1): every offloaded tensor
    and every host-updated parameter verified when it comes back.

    Bounds: ``capacity`` from one page (2 MiB) to 1 PiB; ``copy_bandwidth`` from 10 MB/s (the
    floor stowage's waits assume: slower, a wait for copies could pass its deadline) to 1 PB/s;
    ``pinned_limit`` positive. device="cuda" on a machine without a CUDA device raises
    NoCudaDevice and installs nothing.
    """
    if conf is not None and not isinstance(conf, str):
        raise TypeError(f"conf must be a 'key:value,...' string, not {type(conf).__name__}")
    _install(_core.normalize_allocator_config(conf or ""), device, capacity, copy_bandwidth, pinned_limit)
    if check is not None:  # once installed: a refused enable() changes nothing
        checking.set_enabled(check)


def _install(config: str, device: str, capacity: int | str | None, copy_bandwidth: int | str | None,
             pinned_limit: int | str | None) -> None:
    """enable()'s work: stowage as `device`'s allocator, or a refusal with nothing installed."""
    if device == "cpu":
        if capacity is None:
            raise ValueError("stowage.enable(device='cpu') needs a capacity, e.g. capacity='4GiB'")
        size = in_range(capacity, "capacity", MIN_CAPACITY, MAX_CAPACITY,
                         "from one page of the simulated device (2 MiB) to 1 PiB")
        bandwidth = 0 if copy_bandwidth is None else in_range(
            copy_bandwidth, "copy_bandwidth", MIN_COPY_BANDWIDTH, MAX_COPY_BANDWIDTH,
            "from 10 MB/s (the floor stowage's waits assume: slower, a wait for copies would pass its "
            "deadline) to 1 PB/s, in bytes per second")
        pinned = 0 if pinned_limit is None else in_range(pinned_limit, "pinned_limit", 1, MAX_BYTE_COUNT,
                                                          "from 1 byte to 2**60")
        torch_module().enable_cpu(size, config, float(bandwidth), pinned)
        return
    if copy_bandwidth is not None or pinned_limit is not None:
        raise ValueError("copy_bandwidth and pinned_limit describe CPU mode's simulated device: "
                         "pass them with device='cpu'")
    if device == "cuda":
        _enable_cuda(config)
        return
    raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")


class NoCudaDevice(RuntimeError):
    """stowage.enable(device="cuda") where torch sees no CUDA device: nothing was installed."""


def _enable_cuda(config: str) -> None:
    import torch  # here: `import stowage` must not import torch

    module = torch_module()
    if not module.has_cuda:
        raise RuntimeError(
            f"this build of stowage has no CUDA allocator for torch {torch.__version__} (it needs "
            "the CUDA toolkit at build time and torch "
            f"{module.cuda_torch_versions or '2.11'}); with other torch versions use "
            "torch.cuda.memory.CUDAPluggableAllocator(stowage.c_library_path(), "
            "'stowage_malloc', 'stowage_free')"
        )
    if not is_cuda_allocator(module) and torch.cuda.device_count() == 0:  # (does not initialise CUDA)
        raise NoCudaDevice(
            "stowage.enable(): this machine has no CUDA device (torch.cuda.device_count() is 0), so "
            "there is no CUDA allocator to replace; nothing was installed. Without a GPU, use CPU "
            "mode: stowage.enable(device='cpu', capacity='4GiB')")
    if is_cuda_allocator(module):
        if module.cuda_configuration() != config:
            raise RuntimeError(
                f"stowage is already torch's CUDA allocator with configuration "
                f"'{module.cuda_configuration()}'; it cannot change to '{config}' in this process"
            )
        return
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA is already initialised in this process, so torch keeps its own allocator. "
            "Enable stowage before the first CUDA tensor: set STOWAGE_ALLOC_CONF (empty for the "
            "defaults) in the environment, or call stowage.enable() right after importing torch"
        )
    module.enable_cuda(config)


def c_library_path() -> str:
    """The path of libstowage.so, for torch builds stowage's own allocator does not support::

    a = torch.cuda.memory.CUDAPluggableAllocator(stowage.c_library_path(),
                                                 "stowage_malloc", "stowage_free")
    torch.cuda.memory.change_current_allocator(a)
    """
    module = torch_module()
    if not module.has_cuda:
        raise RuntimeError("this build of stowage has no CUDA support (no CUDA toolkit at build time)")
    return str(module.c_library_path())


def disable() -> None:
    """Gives torch back its own CPU allocator (CPU mode). Tensors from stowage remain valid.
    torch cannot take back its CUDA allocator once another one served CUDA tensors, so in CUDA
    mode this raises."""
    module = torch_module()
    if is_cuda_allocator(module):
        raise RuntimeError(
            "stowage is torch's CUDA allocator for the rest of this process: torch cannot switch "
            "allocators once CUDA tensors exist (start the program without STOWAGE_ALLOC_CONF "
            "and without stowage.enable() to use torch's own)"
        )
    module.disable_cpu()


def is_enabled() -> bool:
    """Whether stowage is torch's CUDA allocator, or its CPU allocator (CPU mode)."""
    module = torch_module()
    return is_cuda_allocator(module) or is_cpu_allocator(module)


def memory_stats(device: Any = None) -> OrderedDict[str, int]:
    """The allocator's statistics under torch.cuda.memory_stats()'s keys, and the offload
    engine's under "offload." keys once anything was offloaded from the device, sorted by key."""
    module = enabled_module()
    index = device_index(device)
    stats = dict(module.memory_stats(index))
    stats.update(module.offload_stats(index))
    return OrderedDict(sorted(stats.items()))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_stats(device: Any = None) -> None:
    enabled_module().reset_peak_stats(device_index(device))


def reset_accumulated_stats(device: Any = None) -> None:
    enabled_module().reset_accumulated_stats(device_index(device))


def empty_cache() -> None:
    """Returns cached memory to the device (on the paged path, every free page)."""
    module = enabled_module()
    if is_cuda_allocator(module):
        import torch  # here: `import stowage` must not import torch

        torch.cuda.empty_cache()  # every device, as torch does
    elif module.cuda_library_in_use():
        module.empty_cuda_caches()  # every device; torch's pluggable allocator may not call in
    else:
        module.empty_cache(CPU_MODE)


def mark_step() -> None:
    """Marks the end of a training step: put it once per iteration of the training loop.

    With ``placement:learned`` the allocator uses the marks as step boundaries (otherwise it
    finds the repeating step itself); every configuration records the mark in history, where
    ``stowage replay`` finds it. With activation offload it also ends the offload engines' step
    (``stowage.offload.end_step()``). Does nothing while stowage is not enabled, so the call can
    stay in the loop."""
    module = torch_module()
    if was_enabled(module):
        module.mark_step()
    module.offload_end_step()  # stowage.offload.end_step(): nothing to do without offload


def placement_status(device: Any = None) -> dict[str, Any]:
    """Learned placement's state: enabled, phase ("learning", "placed" or "off"), layouts_made (step
    layouts the allocator learned), departures, arena_bytes and layout_live_bytes (of the layout in
    force) and placed_allocations."""
    return dict(enabled_module().placement_status(device_index(device)))


def record_history(enabled: bool = True, stacks: str = "python", max_entries: int = DEFAULT_MAX_ENTRIES,
                   tags: bool = True) -> None:
    """Records alloc, free, segment and oom events with the Python stack ("python") or Python and
    C++ stacks ("all"), keeping the newest ``max_entries``. enabled=False stops and forgets.
    On a GPU this is torch.cuda.memory._record_memory_history, which stowage serves.

    Where stowage keeps the history (CPU mode, a GPU through stowage's C library), ``tags``
    also notes what each allocation is and which module made it (stowage.tagging: parameters,
    gradients, optimizer states, saved activations, inputs), written into snapshots as
    ``stowage_tags``; ``stowage inspect`` then reports exact categories and module paths.
    The saved-tensor hook this takes refuses a backward with ``create_graph=True``, and
    ``torch.func``'s transforms refuse to run under any saved-tensor hook: record such a loop
    with ``tags=False``."""
    module = enabled_module()
    if is_cuda_allocator(module):
        import torch  # here: `import stowage` must not import torch

        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
        torch.cuda.memory._record_memory_history(
            "all" if enabled else None, context="all", stacks=stacks, max_entries=max_entries
        )
        return
    # CPU mode, or a GPU through the C library (torch's pluggable allocator records nothing
    # itself): stowage records, with stacks in CPU mode only.
    index = device_index(None)
    tagging.stop()
    module.record_history(enabled, stacks, max_entries, index)
    if enabled and tags:
        tagging.start(module, index, max_entries)


def snapshot() -> dict[str, Any]:
    """torch.cuda.memory._snapshot()'s dict: segments with blocks, device_traces, settings.
    On a GPU it is torch.cuda.memory._snapshot() itself, which stowage serves."""
    module = enabled_module()
    if is_cuda_allocator(module):
        import torch  # here: `import stowage` must not import torch

        out = dict(torch.cuda.memory._snapshot())
    else:
        index = device_index(None)
        out, recorded = module.snapshot(index)
        tagging.attach(out, recorded, index)
    offload = dict(module.offload_stats(device_index(None)))
    if offload:
        out["offload"] = offload  # memory_viz ignores keys it does not know
    return out


def dump_snapshot(path: str | Path) -> None:
    """Pickles snapshot() with protocol 4, which pytorch.org/memory_viz reads."""
    Path(path).write_bytes(pickle.dumps(snapshot(), protocol=4))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """The statistics as a table in torch.cuda.memory_summary()'s layout."""
    stats, index = memory_stats(device), device_index(device)
    title = _core.memory_summary_title(index, enabled_module().capacity(index))
    return str(_core.memory_summary(dict(stats), title, abbreviated, summary_lines(stats)))
