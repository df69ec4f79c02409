"""Which module is running, by path, and the call numbers a plan keys saved tensors by.

The step context's module calls (stowage.step_context) push a frame as each module's forward
begins and pop it as it ends. Paths
come from the outermost module's ``named_modules()`` (``""`` is that module): the model, when it
is given (``root``), as it must be for a step that does not call the model's forward (a loss
method that calls its blocks); else the first module whose forward runs with none running, and
each later such module not already named, numbered (``"1:"``, ...). A frame numbers
the tensors autograd saves while it is the innermost (its ``saves``); a module's call number
counts its forward calls in this step. Forwards run again inside backward (a checkpoint's
recomputation) are not counted, so the numbers are those of the step's forward. Given the calls
each path had in a recorded step (``calls``), a module called more often than that (the
micro-batches of an accumulation under one plan) numbers its later calls as the recorded ones
again, cyclically: each forward pass is placed as the recorded one was.

Contract: one per step recorder or plan, used on the thread running the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from stowage import step_context


@dataclass
class Frame:
    module: Any
    path: str
    call: int
    saves: int = 0
    data: dict[str, Any] = field(default_factory=dict)


class ModuleFrames:
    """The running modules' frames; ``on_enter(frame, args)`` / ``on_leave(frame)`` see each."""

    def __init__(self, on_enter: Callable[[Frame, tuple[Any, ...]], None] | None = None,
                 on_leave: Callable[[Frame], None] | None = None, on_root: Callable[[Any], None] | None = None,
                 root: Any = None, calls: dict[str, int] | None = None) -> None:
        self.stack: list[Frame] = []
        self.paths: dict[int, str] = {}
        self.roots: list[Any] = []
        self._calls: dict[str, int] = {}
        self._recorded_calls = calls or {}
        self._on_enter, self._on_leave, self._on_root = on_enter, on_leave, on_root
        self._unsubscribe: Callable[[], None] | None = None
        self._given_root = root

    def install(self) -> None:
        if self._given_root is not None and id(self._given_root) not in self.paths:
            self._add_root(self._given_root)
        self._unsubscribe = step_context.module_calls.subscribe(self._entered, self._left, compiled=True)

    def remove(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @property
    def top(self) -> Frame | None:
        return self.stack[-1] if self.stack else None

    def path_of(self, module: Any) -> str:
        return self.paths.get(id(module), "")

    def _entered(self, call: step_context.Call, args: tuple[Any, ...]) -> None:
        if call.backward:
            return
        module = call.module
        if not self.stack and id(module) not in self.paths:
            self._add_root(module)
        path = self.paths.get(id(module), f"<{type(module).__name__}>")
        number = self._calls.get(path, 0)
        self._calls[path] = number + 1
        recorded = self._recorded_calls.get(path)
        frame = Frame(module, path, number % recorded if recorded else number)
        self.stack.append(frame)
        if self._on_enter is not None:
            self._on_enter(frame, args)

    def _add_root(self, module: Any) -> None:
        prefix = "" if not self.roots else f"{len(self.roots)}:"
        self.roots.append(module)
        for name, inner in module.named_modules():
            self.paths.setdefault(id(inner), prefix + name)
        if self._on_root is not None:
            self._on_root(module)

    def _left(self, call: step_context.Call, args: Any, kwargs: Any) -> None:
        if call.backward or not self.stack or self.stack[-1].module is not call.module:
            return
        frame = self.stack.pop()
        if self._on_leave is not None:
            self._on_leave(frame)
