"""Bounded waits on the Python side, by the rules of Note [Bounded waits]
(base/bounded_wait.hpp): for waits the C++ layer does not make itself, such as on
torch's CUDA events and streams.

    from stowage.waiting import wait_until
    wait_until(event.query, "the optimizer's write-back of bucket 3", bytes=bucket_bytes)

``wait_until(done, what, bytes)`` polls ``done()`` with sleeps growing from 10 us to 2 ms (each
sleep answers Ctrl-C: KeyboardInterrupt, the awaited work going on), and raises TimeoutError
naming `what` once the wait passes its deadline: WAIT_SLACK_SECONDS plus `bytes` at
FLOOR_BYTES_PER_SECOND, the same figures as the C++ waits (stowage._core exports them).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stowage import _core

FLOOR_BYTES_PER_SECOND: float = _core.wait_floor_bytes_per_second
WAIT_SLACK_SECONDS: float = _core.wait_slack_seconds
_FIRST_SLICE = 10e-6
_LONGEST_SLICE = 2e-3


def deadline_seconds(bytes: int, floor_bytes_per_second: float = FLOOR_BYTES_PER_SECOND,
                     slack_seconds: float = WAIT_SLACK_SECONDS) -> float:
    """How long a wait for work moving `bytes` may take before it gives up."""
    return slack_seconds + max(0, bytes) / floor_bytes_per_second


def wait_until(done: Callable[[], bool], what: str, bytes: int = 0, *,
               floor_bytes_per_second: float = FLOOR_BYTES_PER_SECOND,
               slack_seconds: float = WAIT_SLACK_SECONDS) -> None:
    """Returns once `done()` is true; TimeoutError naming `what` at the deadline. The deadline's
    parts default to Note [Bounded waits]'s; tests make them short."""
    if done():
        return
    allowed = deadline_seconds(bytes, floor_bytes_per_second, slack_seconds)
    start = time.monotonic()
    pause = _FIRST_SLICE
    while not done():
        waited = time.monotonic() - start
        if waited >= allowed:
            raise TimeoutError(f"gave up waiting for {what} ({_core.format_bytes(max(0, bytes))}) after "
                               f"{waited:.1f} s, the deadline for that many bytes at "
                               f"{floor_bytes_per_second / 1e6:g} MB/s plus {slack_seconds:g} s: the device is "
                               "stuck, or its copies are far slower than any real link")
        time.sleep(min(pause, allowed - waited))
        pause = min(_LONGEST_SLICE, pause * 2)
