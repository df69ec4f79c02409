"""The step context: what stowage observes of a training step as it runs, in one place; recording,
plans, activation offload, tagging and check mode subscribe to it.

- ``module_calls``: the stack of module forwards running, from one pair of global module forward
  hooks (before, and after: always called) registered while anything subscribes. Subscribers are
  told as each call begins (``entered(call, args)``, the call on top of the stack) and ends
  (``left(call, args, kwargs)``, the call off the stack; also for a forward that began before
  anything subscribed), in the order they subscribed. While torch.compile traces, calls are
  followed only where a subscriber asks (``compiled=True``): the hook then stops the trace there
  and the module runs eagerly.
- ``SavedTensorRegion``: stowage's saved-tensor regions; ``observe_saves`` (tagging) sees every
  tensor autograd saves while it observes (Note [Seeing every saved tensor]).
- ``in_backward()``: whether the calling thread runs inside a backward, as torch's public
  ModuleTracker reads it.

Contract: one per process; hooks run on the threads torch runs them on and change the stacks
under the GIL; a subscriber subscribes and unsubscribes on the thread running the step.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

_torch: Any = None  # the torch module, once loaded (loaded_torch)
_backward_probe: Any = None  # a torch.utils.module_tracker.ModuleTracker, never entered: its is_bw


def loaded_torch() -> Any:
    """torch, imported on first use: `import stowage` must not import torch (the import hook
    installs stowage as torch's allocator before torch first loads). The modules `import stowage`
    loads that observe torch (this one, tagging) take it from here."""
    global _torch, _backward_probe
    if _torch is None:
        import torch  # here: keeps torch out of `import stowage` (above)
        from torch.utils.module_tracker import ModuleTracker

        _backward_probe, _torch = ModuleTracker(), torch
    return _torch


def in_backward() -> bool:
    """Whether the calling thread runs inside a backward (autograd's engine runs a graph task)."""
    loaded_torch()
    return bool(_backward_probe.is_bw)


def block_modules(root: Any) -> set[int]:
    """The modules a plan may run under selective checkpointing: the outermost items of an
    ``nn.ModuleList`` or ``nn.Sequential`` below the root (a model's repeated blocks); the root's
    children when it has none."""
    torch = loaded_torch()
    containers = (torch.nn.ModuleList, torch.nn.Sequential)
    found: set[int] = set()

    def visit(module: Any, inside_block: bool) -> None:
        for child in module.children():
            is_block = not inside_block and isinstance(module, containers) and not isinstance(child, containers)
            if is_block:
                found.add(id(child))
            visit(child, inside_block or is_block)

    visit(root, False)
    if not found:
        found = {id(child) for child in root.children()}
    return found


class Call(NamedTuple):
    """One module forward running; ``backward``: it runs inside a backward (a recomputation)."""

    module: Any
    backward: bool


def module_paths(root: Any, qualified: bool = False) -> dict[int, str]:
    """The one naming of module paths: each module under `root`, by id, as its dotted path from
    root ("3", "blocks.0.attn"; root itself: its class name); `qualified`: each after root's class
    name ("Sequential.3"), as snapshots' tags name them. Check mode's messages take the first."""
    root_name = type(root).__name__
    return {id(m): (f"{root_name}.{n}" if qualified else n) if n else root_name for n, m in root.named_modules()}


Entered = Callable[[Call, tuple[Any, ...]], None]  # (the call, its positional arguments)
Left = Callable[[Call, Any, dict[str, Any]], None]  # (the call, its arguments, its keyword arguments)


class ModuleCalls:
    """The stack of module forwards running (module docstring)."""

    def __init__(self) -> None:
        self.stack: list[Call] = []
        self._subscribers: list[tuple[Entered | None, Left | None, bool]] = []
        self._follow_compiled = False
        self._handles: list[Any] = []

    def subscribe(self, entered: Entered | None = None, left: Left | None = None, *,
                  compiled: bool = False) -> Callable[[], None]:
        """Adds a subscriber; returns what removes it (the hooks go with the last one)."""
        torch = loaded_torch()
        subscriber = (entered, left, compiled)
        self._subscribers = self._subscribers + [subscriber]  # (a copy: hooks iterate the old list)
        self._follow_compiled = any(s[2] for s in self._subscribers)
        if not self._handles:
            module = torch.nn.modules.module
            self._handles = [module.register_module_forward_pre_hook(self._entered),
                             module.register_module_forward_hook(self._left, with_kwargs=True, always_call=True)]

        def unsubscribe() -> None:
            self._subscribers = [s for s in self._subscribers if s is not subscriber]
            self._follow_compiled = any(s[2] for s in self._subscribers)
            if not self._subscribers:
                for handle in self._handles:
                    handle.remove()
                self._handles = []
                self.stack = []

        return unsubscribe

    def _entered(self, module: Any, args: tuple[Any, ...]) -> None:
        if not self._follow_compiled and _torch.compiler.is_compiling():
            return
        call = Call(module, _backward_probe.is_bw)
        self.stack.append(call)
        for entered, _, _ in self._subscribers:
            if entered is not None:
                entered(call, args)

    def _left(self, module: Any, args: Any, *kwargs_and_output: Any) -> None:
        """(kwargs, output); only (output,) where torch calls it after the forward raised)"""
        if not self._follow_compiled and _torch.compiler.is_compiling():
            return
        if self.stack and self.stack[-1].module is module:
            call = self.stack.pop()
        else:  # a forward that began before anything subscribed
            call = Call(module, _backward_probe.is_bw)
        kwargs = kwargs_and_output[0] if len(kwargs_and_output) == 2 else {}
        for _, left, _ in self._subscribers:
            if left is not None:
                left(call, args, kwargs)


module_calls = ModuleCalls()


# Note [Seeing every saved tensor]
# torch applies only the innermost saved_tensors_hooks region's hooks (saved_tensors_hooks'
# documentation: "only the inner-most pair of hooks will be applied"). Tagging must see every
# saved tensor, also those handed to regions that are not stowage's (the user's,
# torch.utils.checkpoint's), which stowage cannot route through a stack of its own: they enter
# torch's directly. torch 2.11 offers no public way to do that (torch/autograd/graph.py, read for
# this: saved_tensors_hooks.__enter__ and __exit__ are torch._C._autograd's private
# _push_saved_tensors_default_hooks and _pop_saved_tensors_default_hooks, the stack lives in C++
# (SavedTensorDefaultHooks) with no public query, observer or event; disable_saved_tensors_hooks
# only makes entering a region raise; Node and Tensor hooks run in backward, after the pack). So,
# only while something observes, and here only:
# - outside any region, its own hooks (keep the tensor as the offloader keeps one) go at the
#   bottom of torch's stack, through the public saved_tensors_hooks. A region left open when
#   observing starts would pop them at its exit (__exit__ pops the top, whichever it is): then
#   they are not put in, and only regions entered from then on are observed. Whether one is open
#   is the one question asked of torch's private API (_top_saved_tensors_default_hooks).
# - stowage's own regions show the observers each tensor before their pack takes it;
# - regions of their own entered while observing are seen the only way torch leaves:
#   saved_tensors_hooks.__enter__ is wrapped to show the observers what the region's pack is
#   handed (and __exit__, to know when the last such region closes).
# - observing stops; the bottom hooks come out at once when no region entered while observing
#   is open, else as soon as the last such region exits (its exit would otherwise pop them).
# Without observing (no recording with tags), torch is neither patched nor asked.


class SavedTensorRegion:
    """One stowage saved-tensor region: torch's saved_tensors_hooks with `pack` and `unpack`; the
    observer (if one observes as it is entered) sees each tensor first. Entered once."""

    def __init__(self, pack: Callable[[Any], Any], unpack: Callable[[Any], Any]) -> None:
        self._pack, self._unpack = pack, unpack
        self._hooks: Any = None

    def __enter__(self) -> SavedTensorRegion:
        # (while something observes, torch's __enter__ is _entered_region: it shows the observer each tensor)
        hooks = loaded_torch().autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks = hooks
        return self

    def __exit__(self, *error: Any) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(*error)


_observer: Callable[[Any], None] | None = None  # what sees each saved tensor (tagging's note)
_bottom: Any = None  # the observer's saved_tensors_hooks at the bottom of torch's stack
_pending: Any = None  # an observer's bottom hooks, observing stopped, below a region still open
_open: list[Any] = []  # regions entered while saved_tensors_hooks is wrapped and not yet left
_plain: tuple[Any, Any] | None = None  # saved_tensors_hooks' own __enter__ and __exit__, while wrapped


def _noting(pack: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def noted(tensor: Any) -> Any:
        observer = _observer
        if observer is not None:  # (a region entered while observing may outlive it)
            observer(tensor)
        return pack(tensor)

    noted._stowage_noting = True  # type: ignore[attr-defined]
    return noted


def _entered_region(region: Any) -> None:
    if not getattr(region.pack_hook, "_stowage_noting", False):
        region.pack_hook = _noting(region.pack_hook)
    _open.append(region)
    _plain[0](region)  # type: ignore[index]


def _left_region(region: Any, *error: Any) -> None:
    global _pending
    plain_exit = _plain[1] if _plain is not None else type(region).__exit__  # (a `with` keeps the wrapped one)
    plain_exit(region, *error)
    if region in _open:
        _open.remove(region)
    if _pending is not None and not _open:
        pending, _pending = _pending, None
        plain_exit(pending, None, None, None)
    _unwrap()


def _unwrap() -> None:
    """Puts saved_tensors_hooks' own methods back once nothing observes, no bottom hooks wait,
    and no region entered while wrapped is open."""
    global _plain
    if _plain is not None and _observer is None and _pending is None and not _open:
        hooks = loaded_torch().autograd.graph.saved_tensors_hooks
        hooks.__enter__, hooks.__exit__ = _plain  # type: ignore[method-assign]
        _plain = None


def observe_saves(observer: Callable[[Any], None], pack: Callable[[Any], Any],
                  unpack: Callable[[Any], Any]) -> bool:
    """Shows `observer` every tensor autograd saves until stop_observing(); outside any region,
    `pack` and `unpack` serve autograd. False when a region with hooks of its own was open: then
    only regions entered from here on are observed (Note [Seeing every saved tensor])."""
    global _observer, _bottom, _plain
    torch = loaded_torch()
    stop_observing()
    _observer = observer
    hooks = torch.autograd.graph.saved_tensors_hooks
    if _plain is None:
        _plain = (hooks.__enter__, hooks.__exit__)
        hooks.__enter__, hooks.__exit__ = _entered_region, _left_region  # type: ignore[method-assign]
    if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        return False
    _bottom = hooks(pack, unpack)
    _plain[0](_bottom)
    return True


def stop_observing() -> None:
    """Stops observing saved tensors; the observer's bottom hooks come out now, or as the last
    region entered while observing exits (its exit would otherwise pop them)."""
    global _observer, _bottom, _pending
    _observer = None
    bottom, _bottom = _bottom, None
    if bottom is not None:
        if _open:
            _pending = bottom
        else:
            _plain[1](bottom, None, None, None)  # type: ignore[index]
    _unwrap()
