"""What each allocation is, and which module made it, noted while stowage records history (what is
noted and when: README's "Inspecting a snapshot"), carried by its snapshots as ``stowage_tags``.

A note is (position, address): the history's event count when it was made, and the storage's
address; the notes, module spans and their resolution to a snapshot's events are _core.TagBook's
(snapshot/tag_book.hpp): a storage noted twice takes the first of CATEGORY_ORDER.

Contract: one Tagger at a time (start/stop); hooks run on the threads torch runs them on and
append under the GIL; module paths are noted for the thread that started the recording.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from stowage import _core, step_context

CATEGORY_ORDER = ("parameters", "optimizer states", "gradients", "inputs", "activations")
TAGS_KEY = "stowage_tags"


class CreateGraphRefused(RuntimeError):
    pass


class Tagger:
    """The notes of one recording."""

    def __init__(self, module: Any, device: int, max_entries: int) -> None:
        # Here: keeps torch out of `import stowage` (step_context.loaded_torch).
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._module, self._device = module, device
        self._thread = threading.get_ident()
        self._book = _core.TagBook(max_entries)  # owners keyed by id(parameter or buffer)
        self._running: dict[int, str] = {}  # the top-level forward's {id(module): path}
        self._handles = [
            step_context.module_calls.subscribe(self._entered, self._left),
            register_optimizer_step_pre_hook(self._before_step).remove,
            register_optimizer_step_post_hook(self._after_step).remove,
        ]
        if not step_context.observe_saves(self._observed, self._pack, self._unpack):
            warnings.warn("stowage.record_history started inside a saved_tensors_hooks region: the tensors autograd "
                          "saves outside regions entered from here on are not tagged as activations", stacklevel=4)

    def stop(self) -> None:
        """Removes the hooks. Stopped inside a region with saved-tensor hooks of its own entered
        while recording, the default hooks lie below the region's: they come out as soon as the
        region is left (until then they keep tensors as before, noting nothing)."""
        for remove in self._handles:
            remove()
        step_context.stop_observing()

    # --- notes ---

    def _position(self) -> int:
        return int(self._module.history_recorded(self._device))

    def note(self, tensors: Any, category: int, position: int | None = None, owners: Any = None) -> None:
        """Notes `tensors`' storages (a sequence) as `category`; `owners`, one per tensor, the tensors whose
        module made them (a gradient's or a state's parameter)."""
        torch = step_context.loaded_torch()
        device = torch.device("cpu") if self._device < 0 else torch.device("cuda", self._device)
        addresses, keys = [], []
        for tensor, owner in zip(tensors, tensors if owners is None else owners):
            if isinstance(tensor, torch.Tensor) and tensor.device == device:
                try:
                    address = tensor.untyped_storage().data_ptr()
                except (RuntimeError, NotImplementedError):  # no storage: sparse, nested, a subclass
                    continue
                if address:
                    addresses.append(address)
                    keys.append(id(owner))
        self._book.note(self._position() if position is None else position, addresses, category, keys)

    # --- hooks ---

    def _entered(self, call: step_context.Call, args: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        module = call.module
        at = self._position()
        if not self._book.in_forward:
            # (worked out at each top-level forward: modules are added, ids reused)
            self._running = names = step_context.module_paths(module, qualified=True)
            modules = list(module.modules())  # each parameter and buffer owned by the first that lists it
            self._book.own([_utf8(names.get(id(m), type(m).__name__)) for m in modules],
                           [[id(t) for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]] for m in modules])
            self.note(list(module.parameters()) + list(module.buffers()), 0, at)
            with_grad = [p for p in module.parameters() if p.grad is not None]
            self.note([p.grad for p in with_grad], 2, at, with_grad)
        path = self._running.get(id(module))
        self._book.enter(at, None if path is None else _utf8(path), _utf8(type(module).__name__))

    def _left(self, call: step_context.Call, args: Any, kwargs: dict[str, Any]) -> None:
        if threading.get_ident() != self._thread or not self._book.in_forward:
            return
        at = self._position()
        if self._book.leave(at):  # a top-level forward's inputs (its keyword arguments too): what autograd did not make
            made_here = [t for t in _tensors(args) + _tensors(kwargs) if t.grad_fn is None
                         and not isinstance(t, step_context.loaded_torch().nn.Parameter)]
            self.note(made_here, 3, at)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with_grad = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.note([p.grad for p in with_grad], 2, owners=with_grad)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        pairs = [(value, parameter) for parameter, state in optimizer.state.items() for value in state.values()]
        self.note([value for value, _ in pairs], 1, owners=[parameter for _, parameter in pairs])

    def _observed(self, tensor: Any) -> None:  # a saved tensor some region's hooks take
        self.note((tensor,), 4, owners=(None,))

    def _pack(self, tensor: Any) -> Any:
        if _active is self:  # (left below a region's hooks when recording stopped inside it)
            self.note((tensor,), 4, owners=(None,))
        return self._module.TensorOffloader.keep(tensor), tensor.requires_grad

    def _unpack(self, packed: Any) -> Any:
        kept, requires_grad = packed
        if requires_grad and step_context.loaded_torch().is_grad_enabled():
            raise CreateGraphRefused(
                "stowage.record_history's saved-tensor tags cannot serve a backward that builds a graph "
                "(create_graph=True, or torch.autograd.grad of a saved tensor with grad mode on): its "
                "gradients would differ. Record with stowage.record_history(True, tags=False).")
        return self._module.TensorOffloader.unpack(kept)

    # --- the snapshot's stowage_tags ---

    def tags(self, trace: list[dict[str, Any]], recorded: int) -> dict[str, Any]:
        """The stowage_tags of a device trace whose last event was the (recorded - 1)-th."""
        base = recorded - len(trace)
        allocs = [i for i, event in enumerate(trace) if event.get("action") == "alloc"]
        resolved = self._book.resolve([i + base for i in allocs], [int(trace[i]["addr"]) for i in allocs],
                                      len(CATEGORY_ORDER))
        return {"format": 1, "categories": list(CATEGORY_ORDER),
                "modules": [path.decode("utf-8", "surrogatepass") for path in self._book.paths],
                "events": [allocs[a] for a in resolved.allocation], "category": list(resolved.category),
                "module": list(resolved.module)}


def _utf8(text: str) -> bytes:  # a module's name may hold lone surrogates: kept as they are, never refused
    return text.encode("utf-8", "surrogatepass")


def _tensors(args: Any) -> list[Any]:
    torch = step_context.loaded_torch()
    out: list[Any] = []
    for value in args if isinstance(args, (tuple, list)) else (args,):  # each, or in a tuple, list or dict
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else (value,)
        out.extend(v for v in inner if isinstance(v, torch.Tensor))
    return out


_active: Tagger | None = None


def start(module: Any, device: int, max_entries: int) -> None:
    global _active
    stop()
    _active = Tagger(module, device, max_entries)


def stop() -> None:
    global _active
    active, _active = _active, None
    if active is not None:
        active.stop()


def attach(snapshot: dict[str, Any], recorded: int, device: int) -> None:
    """Adds the active recording's stowage_tags for `device` to a snapshot stowage took."""
    traces = snapshot.get("device_traces") or []
    if _active is not None and _active._device == device and traces:
        snapshot[TAGS_KEY] = {"0": _active.tags(traces[0], recorded)}  # stowage's snapshot: one trace
