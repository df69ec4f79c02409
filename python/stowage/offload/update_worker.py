"""The thread the offloaded optimizer's host updates run on, placed on the CPUs nearest the GPU.

One worker thread takes the updates in the order they are submitted (a bucket's update needs the
previous step's of the same bucket done, and submission order gives that). The C++ update
releases the GIL, so the main thread goes on driving backward meanwhile; the kernel's own threads
(one per CPU given) are made by the worker and inherit its CPU affinity (Linux gives a new thread
its creator's mask), so one ``sched_setaffinity`` places them all on the GPU's NUMA node.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from stowage import _core
from stowage.waiting import wait_until


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cpus_near(pci_bus_id: str | None) -> set[int]:
    """The CPUs this process may use that are nearest the GPU with `pci_bus_id` (all the
    allowed ones when it is None, unknown to hwloc, or shares no CPU with the allowed set)."""
    allowed = os.sched_getaffinity(0)
    if not pci_bus_id:
        return set(allowed)
    try:
        device = _core.numa_topology([pci_bus_id])["pci_devices"][0]
    except (RuntimeError, ValueError, IndexError):
        return set(allowed)
    near = parse_cpu_list(device["cpus"]) & allowed if device["found"] else set()
    return near or set(allowed)


class UpdateWorker:
    """Runs submitted calls one after another on a thread bound to `cpus`.

    Contract: submit() and wait_all() from one thread (the optimizer's caller); close() waits for
    what was submitted.
    """

    def __init__(self, cpus: set[int]) -> None:
        self.cpus = sorted(cpus)
        self.threads = max(1, len(self.cpus))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stowage-adamw",
                                            initializer=self._place)
        self._pending: list[Future[Any]] = []
        self.busy_seconds = 0.0  # time spent in submitted calls, written by the worker thread only

    def _place(self) -> None:
        try:
            os.sched_setaffinity(0, self.cpus)  # 0: the calling thread, on Linux
        except OSError:
            pass  # a cpuset that changed since: run wherever the scheduler puts us

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        future = self._executor.submit(self._timed, call)
        self._pending.append(future)
        return future

    def _timed(self, call: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return call()
        finally:
            self.busy_seconds += time.perf_counter() - start

    def wait_all(self) -> None:
        """Waits for everything submitted; raises the first error one of them raised."""
        pending, self._pending = self._pending, []
        for future in pending:
            finished(future, "the host optimizer's updates")

    def close(self) -> None:
        try:
            self.wait_all()
        finally:
            self._executor.shutdown(wait=True)


def finished(future: Future[Any], what: str, bytes: int = 0) -> Any:
    """`future`'s result, waited for by Note [Bounded waits] (Ctrl-C answers; a deadline from
    `bytes` names `what`)."""
    wait_until(future.done, what, bytes)
    return future.result()
