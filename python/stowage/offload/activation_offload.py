"""Activation offload (``stowage.offload.activations``): tensors saved for backward go to pinned
host memory during forward and come back ahead of backward. What is offloaded and what is not, how
the copies overlap compute, and what happens to storages written through an alias: README's
"Offloading activations" and Note [Saved tensors written through an alias]
(python/tensors/saved_storage.hpp). Its saved-tensor front end, SavedTensorOffload, is shared
with ``with plan:``."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable

from stowage import checking, step_context
from stowage.byte_counts import byte_count
from stowage.serving import CPU_MODE, device_index, is_cpu_allocator, torch_module

DEFAULT_MIN_BYTES = 1 << 20
DEFAULT_MAX_PREFETCH = 1 << 30

_warned_compiled = False


def keep(tensor: Any) -> Any:
    """A saved tensor kept on the device as the offloader keeps one (tensor_offloader.cpp): detached, so
    that an op's saved output does not hold its own graph node through a cycle Python's collector
    cannot see, its version checked when backward unpacks it."""
    return torch_module().TensorOffloader.keep(tensor)


class SavedTensorOffload(step_context.SavedTensorRegion):
    """The one saved-tensor front end of the offload engine: a step-context saved-tensor region
    whose pack is ``place(tensor)`` (the offloader's ``pack(tensor, module_path)``, or
    ``keep(tensor)``) and whose unpack is the offloader's. Entering it configures the engine's
    look-ahead and makes the region's offloader (the buffers of its saved tensors, and the
    storages it must never offload). Its user calls ``forward_ended()`` as its outermost module's
    forward returns.

    Contract: entered and exited once, on the thread that runs the step; the buffers outlive the
    region (the tensors that hold them keep them), its tables do not."""

    def __init__(self, place: Callable[[Any], Any], *, min_bytes: int, prefetch_depth: int | None,
                 max_prefetch: int) -> None:
        super().__init__(place, torch_module().TensorOffloader.unpack)
        self._min_bytes, self._prefetch_depth, self._max_prefetch = min_bytes, prefetch_depth, max_prefetch

    def __enter__(self) -> SavedTensorOffload:
        module = torch_module()
        checking.apply()
        module.offload_configure(self._prefetch_depth, self._max_prefetch)
        self.offloader = module.TensorOffloader(self._min_bytes)
        super().__enter__()
        return self

    def forward_ended(self) -> None:
        """The model's forward returned (not a recomputation inside backward): check mode watches
        the offloaded storages someone else still holds."""
        if not step_context.in_backward():
            self.offloader.forward_ended()

    def __exit__(self, *error: Any) -> None:
        if self._hooks is not None:
            self.offloader.region_ended()
        super().__exit__(*error)


def _allocated() -> int:
    """Bytes allocated on the device that offload moves tensors from: CPU mode's, else the current GPU's."""
    module = torch_module()
    if is_cpu_allocator(module):
        return int(module.memory_stats(CPU_MODE)["allocated_bytes.all.current"])
    torch = step_context.loaded_torch()
    return int(torch.cuda.memory_allocated()) if torch.cuda.is_initialized() else 0


class activations(SavedTensorOffload):
    """Offloads the tensors autograd saves during the ``with`` block to host memory.

    ``min_bytes``: storages smaller stay on the device (default 1 MiB). ``prefetch``: "auto"
    (the look-ahead, up to ``max_prefetch`` bytes, chosen from the last backward's measured copy
    and compute times so that each reload starts at least its copy time before its use: Note
    [Prefetch window]), or a number of tensors to bring back ahead of use beyond the one in use
    (0: each when it is used). ``exclude``: modules whose saved tensors stay on the device.
    """

    def __init__(self, min_bytes: int | str = DEFAULT_MIN_BYTES, prefetch: int | str = "auto",
                 max_prefetch: int | str = DEFAULT_MAX_PREFETCH, exclude: Iterable[Any] = ()) -> None:
        least = byte_count(min_bytes, "min_bytes")
        if least < 0:
            raise ValueError(f"min_bytes must not be negative, not {min_bytes!r}")
        if prefetch != "auto" and (not isinstance(prefetch, int) or prefetch < 0):
            raise ValueError(f"prefetch must be 'auto' or a number of tensors >= 0, not {prefetch!r}")
        super().__init__(self._place, min_bytes=least, prefetch_depth=None if prefetch == "auto" else int(prefetch),
                         max_prefetch=byte_count(max_prefetch, "max_prefetch"))
        self._exclude = {id(module): module for module in exclude}
        self.report = torch_module().OffloadReport()  # what the region did (offload/offload_report.hpp)

    def __enter__(self) -> Any:
        self._excluded = 0
        self._registered: set[int] = set()
        self._top_level: list[Any] = []
        self._depth = 0
        self._names: dict[int, str] = {}  # check mode: module paths, for its messages
        self._allocated_before = _allocated()
        self._unsubscribe = step_context.module_calls.subscribe(self._module_entered, self._module_left)
        super().__enter__()
        return self.report

    def __exit__(self, *error: Any) -> None:
        global _warned_compiled
        super().__exit__(*error)
        self._unsubscribe()
        self.offloader.fill_report(self.report, self._allocated_before, _allocated())
        del self.offloader  # the packed tensors keep their buffers; the region's tables go
        whole = len(self._top_level) == 1 and hasattr(self._top_level[0], "_orig_mod")
        if whole and not _warned_compiled:
            _warned_compiled = True
            warnings.warn(
                "stowage.offload.activations: the model is compiled as a whole (torch.compile), and "
                "torch gives a compiled region's saved tensors to the hooks only after its forward "
                "and takes them all back at the start of its backward, so offload frees nothing "
                "inside it. Compile each block instead (block = torch.compile(block)): offload then "
                "offloads at block boundaries.", stacklevel=2)

    def _place(self, tensor: Any) -> Any:
        if self._excluded:
            return keep(tensor)
        running = step_context.module_calls.stack
        if not self._names or not running:
            return self.offloader.pack(tensor, "")
        module = running[-1].module
        return self.offloader.pack(tensor, self._names.get(id(module), type(module).__name__))

    def _module_entered(self, call: step_context.Call, args: Any) -> None:
        module = call.module
        self._excluded += id(module) in self._exclude
        if self._depth == 0:
            self._top_level.append(module)
            if checking.enabled():
                self._names.update(step_context.module_paths(module))
        self._depth += 1
        if id(module) not in self._registered:
            self._registered.add(id(module))
            inner = getattr(module, "_orig_mod", None)  # a compiled module: its whole model
            owner, recurse = (module, False) if inner is None else (inner, True)
            tensors = list(owner.parameters(recurse=recurse)) + list(owner.buffers(recurse=recurse))
            self.offloader.add_parameters([t for t in tensors if t is not None])

    def _module_left(self, call: step_context.Call, args: Any, kwargs: Any) -> None:
        if id(call.module) in self._exclude:
            self._excluded = max(0, self._excluded - 1)
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self.forward_ended()


def end_step() -> None:
    """Between steps: waits for the offload engines' copies (outside forward and backward) and
    settles the pinned host pool into one arena, so later steps pin nothing new.
    ``stowage.mark_step()`` calls it."""
    torch_module().offload_end_step()


def stats(device: Any = None) -> dict[str, int]:
    """The offload engine's statistics for ``device`` (as in ``stowage.memory_stats()``); empty
    before anything was offloaded there."""
    return dict(torch_module().offload_stats(device_index(device)))
