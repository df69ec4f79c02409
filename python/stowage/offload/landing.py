"""The loop's side of an overlapped step (Note [Overlapped steps], offload/step_order.hpp):
stowage.offload.Adam(overlap=True)'s step() returns while its host part (copies out, host updates,
write-backs, bucket by bucket) runs on a thread of its own. Until a bucket has landed, whatever
reads or writes one of its parameters, a gradient its copies out have not read yet, or one of its
state tensors waits here for it, so that no loop sees a value the step has not finished with:

- a module's forward waits for its own parameters (``recurse=False``) on entry (a global forward
  pre-hook); a compiled module (torch.compile's OptimizedModule) waits for every pending step, as a
  compiled graph cannot wait op by op;
- every other op on the thread that called step() is looked at by a TorchFunctionMode pushed by
  step() while anything is pending: its tensor arguments (top level, and inside lists and tuples as
  torch._foreach_* takes them) are found by identity (a parameter, ``p.data``, ``p.grad``, a state
  tensor) or by storage (a view taken before step()), and the op waits for their bucket.

Buckets land in parameter order, so waiting for one waits for those before it. The mode is taken
off once nothing is pending and it is the top of the thread's mode stack (else at the next chance).

A step() made while another TorchFunctionMode is active is not left pending (mode_conflict():
that mode's exit pops whatever mode is on top, ours included). Limits: modes are thread-local, so another thread that reads parameters while a step is pending is
not made to wait (call the optimizer's flush() first); a tensor sharing no storage with a parameter
(a copy made by hand on another device) is not a parameter's; compiled functions (torch.compile of
a function, not a module) are not waited for at their entry: their ops run inside the graph.

Contract: the thread that called step() (the optimizer's); the registry below is that thread's."""

from __future__ import annotations

import atexit
import sys
import threading
from typing import Any, Iterable

import torch
from torch.overrides import TorchFunctionMode


class Landing:
    """One pending overlapped step as the loop sees it: which tensors wait for which bucket (ids and
    storages), and the step itself (stowage._torch.OverlappedStep). Waiting for a bucket waits for
    every bucket before it (they land in order); the step's error is raised, once, at the first wait
    that finds the step ended with one, named as the `number`-th step() of `owner`."""

    def __init__(self, step: Any, owner: str, number: int, tensors_by_bucket: dict[int, list[torch.Tensor]]) -> None:
        self._step = step
        self._owner = owner
        self._number = number
        self._by_id: dict[int, int] = {}
        self._by_storage: dict[int, int] = {}
        self._held = [t for tensors in tensors_by_bucket.values() for t in tensors]  # (ids stay theirs)
        for bucket, tensors in sorted(tensors_by_bucket.items()):
            for tensor in tensors:
                self._by_id[id(tensor)] = bucket
                pointer = storage_pointer(tensor)
                if pointer:  # a storage shared by buckets waits for the last of them
                    self._by_storage[pointer] = max(bucket, self._by_storage.get(pointer, bucket))
        self._landed = -1  # every bucket up to this one has landed (waited for)
        self._last = max(tensors_by_bucket, default=-1)

    @property
    def pending(self) -> bool:
        return self._step is not None

    def bucket_of(self, tensor: torch.Tensor) -> int | None:
        """The bucket `tensor` waits for (None: none, or landed already)."""
        if not self._by_id:
            return None
        bucket = self._by_id.get(id(tensor))
        if bucket is None and self._by_storage:
            bucket = self._by_storage.get(storage_pointer(tensor))
        return None if bucket is None or bucket <= self._landed else bucket

    def wait(self, bucket: int) -> None:
        if self._step is None or bucket <= self._landed:
            return
        with self._named():
            self._step.wait_landed(bucket)
        self._landed = max(self._landed, bucket)
        if self._landed >= self._last:  # nothing left to look for: ops pay two empty lookups
            self._by_id, self._by_storage, self._held = {}, {}, []

    def finish(self) -> None:
        """Waits for the whole step; raises its error if no wait has yet."""
        step, self._step = self._step, None
        if step is None:
            return
        self._by_id, self._by_storage, self._held = {}, {}, []
        with self._named():
            step.finish()

    def ended(self) -> bool:
        return self._step is None or bool(self._step.ended)

    def _named(self) -> Any:
        return _NamedError(f"raised by the host part of step() number {self._number} of stowage.offload."
                           f"{self._owner}(overlap=True), which ran behind the loop; the step was finished "
                           "whole (Note [Whole steps]) before this was raised")


class _NamedError:
    """Adds `note` to an error raised inside (it keeps its type)."""

    def __init__(self, note: str) -> None:
        self._note = note

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> bool:
        if isinstance(error, Exception):
            error.add_note(self._note)
        return False


def storage_pointer(tensor: torch.Tensor) -> int:
    """The address of `tensor`'s storage (0: none, e.g. a sparse or meta tensor)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


# --- the registry of pending steps, the hook and the mode -------------------------------------------

_landings: list[Landing] = []  # begun and not yet ended (an optimizer dropped meanwhile: until its step ends)
_hook: Any = None  # the global forward pre-hook's handle, while anything is pending
_mode_thread: int | None = None  # the thread the mode was pushed on, while it is


# Reading or replacing a parameter's .grad attribute (``model.zero_grad()``'s ``p.grad = None``)
# touches neither the parameter's values nor a gradient's: the step holds the gradients it took, and
# an op on a gradient itself waits for it. (``p.data = x`` does wait: it swaps the parameter's storage.)
_NO_WAIT = frozenset({torch.Tensor.grad.__get__, torch.Tensor.grad.__set__})


class WaitForLandings(TorchFunctionMode):
    """Makes each op wait for the pending buckets of its tensor arguments (module docstring)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if _landings and func not in _NO_WAIT:
            wait_for_tensors(args)
            if kwargs:
                wait_for_tensors(kwargs.values())
        return func(*args, **(kwargs or {}))


_mode = WaitForLandings()


def wait_for_tensors(values: Iterable[Any]) -> None:
    for value in values:
        if isinstance(value, torch.Tensor):
            wait_for_tensor(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    wait_for_tensor(item)


def wait_for_tensor(tensor: torch.Tensor) -> None:
    for landing in _landings:
        bucket = landing.bucket_of(tensor)
        if bucket is not None:
            landing.wait(bucket)


def mode_conflict() -> str | None:
    """Why a step may not be left pending now (None: it may): another TorchFunctionMode is active
    on this thread and ours is not on its stack. Ours would go above it, and its exit (which pops
    whatever mode is on top) would take ours off while the step is pending."""
    depth = torch._C._len_torch_function_stack()
    stack = [torch._C._get_function_stack_at(i) for i in range(depth)]
    if not stack or any(mode is _mode for mode in stack):
        return None
    return (f"a TorchFunctionMode is active at step() ({type(stack[-1]).__name__}, e.g. a `with torch.device(...)` "
            "block or torch.set_default_device)")


def begin(landing: Landing) -> None:
    """Makes the loop wait for `landing`'s buckets: the hook and the mode go on."""
    global _hook, _mode_thread
    if landing not in _landings:
        _landings.append(landing)
    if _hook is None:
        _hook = torch.nn.modules.module.register_module_forward_pre_hook(_before_forward)
    depth = torch._C._len_torch_function_stack()
    if not any(torch._C._get_function_stack_at(i) is _mode for i in range(depth)):
        _mode.__enter__()
        _mode_thread = threading.get_ident()


def end(landing: Landing) -> None:
    """`landing` is finished: forgotten, and the hook and mode taken off once nothing is pending."""
    if landing in _landings:
        _landings.remove(landing)
    retire()


def retire() -> None:
    """Takes the hook and the mode off when nothing is pending (the mode only from the top of its
    thread's stack: else it stays, doing nothing, until a later chance)."""
    global _hook, _mode_thread
    if any(landing.pending for landing in _landings):
        return
    if _hook is not None:
        _hook.remove()
        _hook = None
    if _mode_thread == threading.get_ident():
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is _mode:
            _mode.__exit__(None, None, None)
            _mode_thread = None


@atexit.register
def _finish_all() -> None:
    """At exit, every pending step is finished before the interpreter goes (its thread takes the GIL
    at each point of the step, which a finalising interpreter would not give back)."""
    while _landings:
        landing = _landings.pop()
        try:
            landing.finish()
        except Exception as error:  # (nothing is left to raise it to)
            print(f"stowage: {error}", file=sys.stderr)


def _before_forward(module: torch.nn.Module, args: Any) -> None:
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # (none imported: no compiled module)
    compiled = eval_frame is not None and isinstance(module, eval_frame.OptimizedModule)
    if not compiled:
        for param in module._parameters.values():
            if param is not None:
                wait_for_tensor(param)
    try:
        for landing in list(_landings):
            # A compiled graph cannot wait op by op; an ended step's error is raised here (the
            # first wait that meets it).
            if compiled or landing.ended():
                _landings.remove(landing)
                landing.finish()
    finally:
        retire()
