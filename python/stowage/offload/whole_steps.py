"""Whole steps for the offloaded optimizer (Note [Whole steps], offload/slot_book.hpp): whatever
interrupts a step(), parameters and states are left both as before it or both as after it.

``interrupts_held()`` holds Ctrl-C for a block: on the main thread Python's SIGINT handler is
replaced by one that only notes the signal, and the thread's waits outlast it (the C++
InterruptHold; their deadlines still end them). When the block ends the handler is put back and,
if the signal came, called: the default raises KeyboardInterrupt there, once the block's work is
whole (and ahead of any error the block raised, which it then carries as its context).

``run_whole(parts)`` runs a step's parts in order to the end whatever one of them raises: the
part that raised runs once more (each resumes where it stopped: a bucket already submitted or
written back is not again), then the others, and the first error is raised after the last. An
error from the second run ends the step where it stands (a device that is stuck: Note [Bounded
waits]).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from stowage.serving import torch_module


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C is acted on when the block ends, not inside it (see the module's documentation)."""
    noted: list[tuple[int, Any]] = []
    previous: Callable[[int, Any], Any] | None = None
    if threading.current_thread() is threading.main_thread():
        current = signal.getsignal(signal.SIGINT)
        if callable(current):  # (not SIG_DFL or SIG_IGN, nor a handler installed outside Python)
            previous = current
            signal.signal(signal.SIGINT, lambda signum, frame: noted.append((signum, frame)))
    try:
        with torch_module().InterruptHold():
            yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
            if noted:
                previous(*noted[0])


def run_whole(parts: Iterable[Callable[[], None]]) -> None:
    """Runs every part, each once more where it raised, then raises the first error."""
    first: BaseException | None = None
    for part in parts:
        try:
            part()
        except BaseException as error:  # (KeyboardInterrupt too: the step is finished first)
            first = error if first is None else first
            part()
    if first is not None:
        raise first
