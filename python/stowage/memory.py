"""The memory API: stowage's counterpart of torch.cuda's memory functions.

The names and meanings follow torch.cuda (memory_stats keys, memory_summary's layout, the
snapshot dict), so code and tools written for one read the other. On a GPU, stowage is torch's
CUDA allocator, and torch.cuda's own functions report the same figures::

    import torch, stowage
    stowage.enable()                           # or STOWAGE_ALLOC_CONF="" in the environment
    ...
    torch.cuda.memory_stats() == stowage.memory_stats() minus stowage's extra keys

The API is the same in CPU mode, where stowage is torch's CPU allocator over a simulated device
of a chosen capacity::

    import stowage, torch
    stowage.enable(device="cpu", capacity="4GiB")
    model = torchvision.models.resnet18()      # every CPU tensor now comes from stowage
    ...
    print(stowage.memory_summary())
    stowage.dump_snapshot("step.pickle")       # readable by torch.cuda._memory_viz

Tensors allocated before enable() keep their old allocator and are freed by it; tensors from
stowage stay valid after disable().
"""

from __future__ import annotations

import operator
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any

from stowage import _core, tagging

DEFAULT_MAX_ENTRIES = 100_000


def _torch_module() -> Any:
    try:
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


MAX_BYTE_COUNT = 2**60  # 1 EiB: beyond any memory, and sums of such stay within C++'s 64-bit sizes
MIN_CAPACITY = 2 << 20  # one page of the simulated device (its granularity): no device is smaller
MAX_CAPACITY = 2**50  # the simulated device's largest (HostBackend::kMaxCapacity)
MIN_COPY_BANDWIDTH = 10_000_000  # 10 MB/s: the floor of stowage's waits (Note [Bounded waits])
MAX_COPY_BANDWIDTH = 10**15


def _parsed(value: int | str, name: str) -> int:
    """An int, or a size such as "4GiB" parsed; TypeError naming `name` for anything else."""
    if isinstance(value, str):
        try:
            return int(_core.parse_byte_size(value))
        except ValueError as error:  # the parser's message, with the knob's name
            raise type(error)(f"{name}: {str(error).split(' (at ')[0]}") from None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int or a size such as '4GiB', not {type(value).__name__}")
    return operator.index(value)


def _bytes(value: int | str, name: str = "a size in bytes") -> int:
    """A byte count from an int or a size such as "4GiB"; TypeError or ValueError naming `name`
    for anything else, or for a count outside 0 to MAX_BYTE_COUNT."""
    size = _parsed(value, name)
    if not 0 <= size <= MAX_BYTE_COUNT:
        raise ValueError(f"{name} must be from 0 to 2**60 bytes, not {value!r}")
    return size


def _in_range(value: int | str, name: str, low: int, high: int, bounds: str) -> int:
    """`value` parsed, within [low, high] (`bounds` says them), or ValueError naming `name`."""
    size = _parsed(value, name)
    if not low <= size <= high:
        raise ValueError(f"{name} must be {bounds}, not {value!r}")
    return size


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
    ``check=True`` turns on check mode (stowage.checking, as STOWAGE_CHECK=1): every paged tensor
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
        from stowage import checking

        checking.set_enabled(check)


def _install(config: str, device: str, capacity: int | str | None, copy_bandwidth: int | str | None,
             pinned_limit: int | str | None) -> None:
    """enable()'s work: stowage as `device`'s allocator, or a refusal with nothing installed."""
    if device == "cpu":
        if capacity is None:
            raise ValueError("stowage.enable(device='cpu') needs a capacity, e.g. capacity='4GiB'")
        size = _in_range(capacity, "capacity", MIN_CAPACITY, MAX_CAPACITY,
                         "from one page of the simulated device (2 MiB) to 1 PiB")
        bandwidth = 0 if copy_bandwidth is None else _in_range(
            copy_bandwidth, "copy_bandwidth", MIN_COPY_BANDWIDTH, MAX_COPY_BANDWIDTH,
            "from 10 MB/s (the floor stowage's waits assume: slower, a wait for copies would pass its "
            "deadline) to 1 PB/s, in bytes per second")
        pinned = 0 if pinned_limit is None else _in_range(pinned_limit, "pinned_limit", 1, MAX_BYTE_COUNT,
                                                          "from 1 byte to 2**60")
        _torch_module().enable_cpu(size, config, float(bandwidth), pinned)
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
    import torch

    module = _torch_module()
    if not module.has_cuda:
        raise RuntimeError(
            f"this build of stowage has no CUDA allocator for torch {torch.__version__} (it needs "
            "the CUDA toolkit at build time and torch "
            f"{module.cuda_torch_versions or '2.11'}); with other torch versions use "
            "torch.cuda.memory.CUDAPluggableAllocator(stowage.c_library_path(), "
            "'stowage_malloc', 'stowage_free')"
        )
    if not module.cuda_enabled() and torch.cuda.device_count() == 0:  # (does not initialise CUDA)
        raise NoCudaDevice(
            "stowage.enable(): this machine has no CUDA device (torch.cuda.device_count() is 0), so "
            "there is no CUDA allocator to replace; nothing was installed. Without a GPU, use CPU "
            "mode: stowage.enable(device='cpu', capacity='4GiB')")
    if module.cuda_enabled():
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
    module = _torch_module()
    if not module.has_cuda:
        raise RuntimeError("this build of stowage has no CUDA support (no CUDA toolkit at build time)")
    return str(module.c_library_path())


def disable() -> None:
    """Gives torch back its own CPU allocator (CPU mode). Tensors from stowage remain valid.
    torch cannot take back its CUDA allocator once another one served CUDA tensors, so in CUDA
    mode this raises."""
    module = _torch_module()
    if module.cuda_enabled():
        raise RuntimeError(
            "stowage is torch's CUDA allocator for the rest of this process: torch cannot switch "
            "allocators once CUDA tensors exist (start the program without STOWAGE_ALLOC_CONF "
            "and without stowage.enable() to use torch's own)"
        )
    module.disable_cpu()


def is_enabled() -> bool:
    """Whether stowage is torch's CUDA allocator, or its CPU allocator (CPU mode)."""
    module = _torch_module()
    return bool(module.cuda_enabled() or module.is_enabled())


_CPU = -1


def _on_cuda(module: Any) -> bool:
    """Whether stowage serves CUDA memory: as torch's allocator, or through the C library
    (torch's CUDAPluggableAllocator over libstowage.so)."""
    return bool(module.cuda_enabled() or module.cuda_library_in_use())


def _module() -> Any:
    module = _torch_module()
    if not _on_cuda(module) and not module.was_enabled():
        raise RuntimeError(
            "stowage is not enabled: call stowage.enable() (a GPU) or "
            "stowage.enable(device='cpu', capacity=...) first"
        )
    return module


def _index(device: Any) -> int:
    """-1 for CPU mode, else the CUDA device index (the current device for None)."""
    module = _module()
    if device is not None and str(device) == "cpu":
        return _CPU
    if not _on_cuda(module):
        return _CPU
    import torch

    return int(torch.cuda._get_device_index(device, optional=True))


def memory_stats(device: Any = None) -> OrderedDict[str, int]:
    """The allocator's statistics under torch.cuda.memory_stats()'s keys, and the offload
    engine's under "offload." keys once anything was offloaded from the device, sorted by key."""
    module = _module()
    index = _index(device)
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
    _module().reset_peak_stats(_index(device))


def reset_accumulated_stats(device: Any = None) -> None:
    _module().reset_accumulated_stats(_index(device))


def empty_cache() -> None:
    """Returns cached memory to the device (on the paged path, every free page)."""
    module = _module()
    if module.cuda_enabled():
        import torch

        torch.cuda.empty_cache()  # every device, as torch does
    elif module.cuda_library_in_use():
        module.empty_cuda_caches()  # every device; torch's pluggable allocator may not call in
    else:
        module.empty_cache(_CPU)


def mark_step() -> None:
    """Marks the end of a training step: put it once per iteration of the training loop.

    With ``placement:learned`` the allocator uses the marks as step boundaries (otherwise it
    finds the repeating step itself); every configuration records the mark in history, where
    ``stowage replay`` finds it. With activation offload it also ends the offload engines' step
    (``stowage.offload.end_step()``). Does nothing while stowage is not enabled, so the call can
    stay in the loop."""
    module = _torch_module()
    if _on_cuda(module) or module.was_enabled():
        module.mark_step()
    module.offload_end_step()  # stowage.offload.end_step(): nothing to do without offload


def placement_status(device: Any = None) -> dict[str, Any]:
    """Learned placement's state: enabled, phase ("learning", "placed" or "off"), layouts_made (step
    layouts the allocator learned), departures, arena_bytes and layout_live_bytes (of the layout in
    force) and placed_allocations. plans_made, plan_live_bytes and planned_allocations are the
    deprecated names of layouts_made, layout_live_bytes and placed_allocations, kept for one release."""
    return dict(_module().placement_status(_index(device)))


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
    module = _module()
    if module.cuda_enabled():
        import torch

        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
        torch.cuda.memory._record_memory_history(
            "all" if enabled else None, context="all", stacks=stacks, max_entries=max_entries
        )
        return
    # CPU mode, or a GPU through the C library (torch's pluggable allocator records nothing
    # itself): stowage records, with stacks in CPU mode only.
    index = _index(None)
    tagging.stop()
    module.record_history(enabled, stacks, max_entries, index)
    if enabled and tags:
        tagging.start(module, index, max_entries)


def snapshot() -> dict[str, Any]:
    """torch.cuda.memory._snapshot()'s dict: segments with blocks, device_traces, settings.
    On a GPU it is torch.cuda.memory._snapshot() itself, which stowage serves."""
    module = _module()
    if module.cuda_enabled():
        import torch

        out = dict(torch.cuda.memory._snapshot())
    else:
        index = _index(None)
        out, recorded = module.snapshot(index)
        tagging.attach(out, recorded, index)
    offload = dict(module.offload_stats(_index(None)))
    if offload:
        out["offload"] = offload  # memory_viz ignores keys it does not know
    return out


def dump_snapshot(path: str | Path) -> None:
    """Pickles snapshot() with protocol 4, which pytorch.org/memory_viz reads."""
    Path(path).write_bytes(pickle.dumps(snapshot(), protocol=4))


def _format_size(size: int, reference: int) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if reference < 768 * 1024 or unit == "TiB":
            return f"{size:6d} {unit}"
        size //= 1024
        reference //= 1024
    return f"{size:6d} TiB"


def _format_count(count: int, reference: int) -> str:
    for unit in (" ", "K", "M"):
        if reference < 750 * 1000 or unit == "M":
            return f"{count:7d} {unit} "
        count //= 1000
        reference //= 1000
    return f"{count:7d} M "


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """The statistics as a table in torch.cuda.memory_summary()'s layout."""
    stats = memory_stats(device)
    index = _index(device)
    capacity = _module().capacity(index)
    lines = ["=" * 75]
    if index == _CPU:
        title = f"stowage memory summary, simulated device of {_core.format_bytes(capacity)}"
    else:
        title = f"stowage memory summary, CUDA device {index} ({_core.format_bytes(capacity)})"
    lines.append(f"{title:^75}")
    lines.append("-" * 75)
    counters = f"OOMs: {stats['num_ooms']:<12d} |  device alloc retries: {stats['num_alloc_retries']}"
    lines.append(f"{counters:^75}")
    lines.append("=" * 75)
    lines.append("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ")
    metrics = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "Reserved memory", _format_size),
        ("inactive_split_bytes", "Non-releasable memory", _format_size),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "Reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    for key, name, formatter in metrics:
        lines.append("-" * 75)
        pools = [("all", name)]
        if not abbreviated:
            pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        reference = [stats[f"{key}.all.{field}"] for field in ("current", "peak", "allocated", "freed")]
        for pool, label in pools:
            values = [stats[f"{key}.{pool}.{field}"] for field in ("current", "peak", "allocated", "freed")]
            cells = " | ".join(formatter(v, r) for v, r in zip(values, reference))
            lines.append(f" {label:<21} | {cells} ")
    for key, name in (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize segments")):
        lines.append("-" * 75)
        values = [stats[f"{key}.{field}"] for field in ("current", "peak", "allocated", "freed")]
        cells = " | ".join(_format_count(v, v) for v in values)
        lines.append(f" {name:<21} | {cells} ")
    lines.append("=" * 75)
    from stowage.offload import summary_lines

    offload = summary_lines(stats)
    if offload:
        lines += [f" {line:<73} " for line in offload] + ["=" * 75]
    return "".join(f"|{line}|\n" for line in lines)
