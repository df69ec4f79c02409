"""Ctrl-C as a user gives it, at a chosen line of stowage's Python code: SIGINT sent to this
process (``signal.raise_signal``) from a trace function, on the main thread, as that line is
about to run. Python's handler acts on it as on a real one: where stowage left it in place,
KeyboardInterrupt is raised at that line; where stowage holds interrupts, what its handler does
happens. No seam in stowage is needed, so the same interruption reaches any version of it.

    with CtrlC(at_line=40) as ctrl_c:      # the 40th line stowage's code runs from here
        optimizer.step()
    with CtrlC(in_function="_at_point", argument="write_back"):  # the first line of the first
        optimizer.step()                     # call of _at_point with an argument "write_back..."
    CtrlC().lines                           # (at_line=0: counts the lines, sends nothing)

Contract: main thread only (Python runs signal handlers there); one signal at most. Python's own
SIGINT handler is put in place for the block (a process started in the background, or by nohup,
ignores SIGINT and has none), and the handler and the trace function in place before are put
back on exit.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import stowage

STOWAGE_FILES = str(Path(stowage.__file__).resolve().parent)


class CtrlC:
    """A context sending SIGINT once at the chosen line (see the module's documentation); `lines`
    and `sent_at` say how many lines ran and where the signal went."""

    def __init__(self, at_line: int = 0, in_function: str | None = None, argument: str | None = None) -> None:
        self.at_line, self.in_function, self.argument = at_line, in_function, argument
        self.lines = 0  # lines of stowage's code run so far
        self.sent_at: tuple[str, int] | None = None  # (function, line) where SIGINT was sent
        self._previous: Any = None
        self._handler: Any = None
        self._ours: dict[str, bool] = {}  # by file name: whether it is stowage's

    def __enter__(self) -> "CtrlC":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("CtrlC runs on the main thread, where Python handles signals")
        self._handler = signal.signal(signal.SIGINT, signal.default_int_handler)
        self._previous = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._previous)
        if self._handler is not None:  # (None: a handler installed outside Python, which cannot be put back)
            signal.signal(signal.SIGINT, self._handler)

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.sent_at is not None:
            return None
        name = frame.f_code.co_filename
        ours = self._ours.get(name)
        if ours is None:
            ours = self._ours[name] = str(Path(name).resolve()).startswith(STOWAGE_FILES)
        return self._line if ours else None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "line" or self.sent_at is not None:
            return self._line
        self.lines += 1
        if self.lines == self.at_line or (frame.f_code.co_name == self.in_function and self._called_with(frame)):
            self.sent_at = (frame.f_code.co_name, frame.f_lineno)
            signal.raise_signal(signal.SIGINT)  # Python's handler runs now (KeyboardInterrupt, if it is torch's)
        return self._line

    def _called_with(self, frame: FrameType) -> bool:
        """Whether the call has a string argument beginning with `argument` (any, without one)."""
        return self.argument is None or any(isinstance(value, str) and value.startswith(self.argument)
                                            for value in frame.f_locals.values())
