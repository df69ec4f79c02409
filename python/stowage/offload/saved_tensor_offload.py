"""The one saved-tensor front end of the offload engine, shared by ``stowage.offload.activations``
and ``with plan:``.

A region configures the engine's look-ahead, makes its offloader (stowage._torch's TensorOffloader:
the buffers of its saved tensors, and the storages it must never offload), and installs torch's
saved-tensor hooks: each tensor autograd saves goes to the region's ``place(tensor)``, which
returns ``offloader.pack(tensor, module_path)`` (offloaded to host memory) or ``keep(tensor)`` (kept on
the device, detached, its version checked at unpack as torch checks its own); unpacking is the
offloader's (through the step context's SavedTensorRegion). What a region decides, and how it
follows modules, is its own. What happens to storages written through an alias: README's
"Offloading activations" and Note [Saved tensors written through an alias]
(python/tensors/saved_storage.hpp). Each calls ``forward_ended()`` as its outermost
module's forward returns (check mode then watches what someone else holds).

Contract: entered and exited once, on the thread that runs the step; the buffers outlive the
region (the tensors that hold them keep them), its tables do not.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Callable

from stowage import checking
from stowage.serving import torch_module
from stowage.step_context import SavedTensorRegion, in_backward


def keep(tensor: Any) -> Any:
    """A saved tensor kept on the device as the offloader keeps one (tensor_offloader.cpp): detached, so
    that an op's saved output does not hold its own graph node through a cycle Python's collector
    cannot see, its version checked when backward unpacks it."""
    return torch_module().TensorOffloader.keep(tensor)


class SavedTensorOffload:
    """Saved-tensor hooks over one offloader; ``place(tensor)`` returns what autograd keeps."""

    def __init__(self, place: Callable[[Any], Any], *, min_bytes: int, prefetch_depth: int | None,
                 max_prefetch: int) -> None:
        self._place, self._min_bytes = place, min_bytes
        self._prefetch_depth, self._max_prefetch = prefetch_depth, max_prefetch
        self._hooks: Any = None

    def __enter__(self) -> SavedTensorOffload:
        module = torch_module()
        checking.apply()
        module.offload_configure(self._prefetch_depth, self._max_prefetch)
        self.offloader = module.TensorOffloader(self._min_bytes)
        hooks = SavedTensorRegion(self._place, module.TensorOffloader.unpack)
        hooks.__enter__()
        self._hooks = hooks
        return self

    def forward_ended(self) -> None:
        """The model's forward returned (not a recomputation inside backward): check mode watches
        the offloaded storages someone else still holds."""
        if not in_backward():
            self.offloader.forward_ended()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._hooks is not None:
            self.offloader.region_ended()
            self._hooks.__exit__(kind, error, traceback)
            self._hooks = None
