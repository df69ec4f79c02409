"""Whole steps for the offloaded optimizer (Note [Whole steps], offload/slot_book.hpp): whatever
interrupts a step(), parameters and states are left both as before it or both as after it.

``interrupts_held()`` holds Ctrl-C for a block: on the main thread Python's SIGINT handler is
replaced by one that only notes the signal, and the thread's waits outlast it (the C++
InterruptHold; their deadlines still end them). When the block ends the handler is put back and,
if the signal came, called: the default raises KeyboardInterrupt there, once the block's work is
whole (and ahead of any error the block raised, which it then carries as its context).
(The step's parts run whole in C++: AdamSlots::run_whole, python/bindings/torch/adam_step.cpp.)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
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
