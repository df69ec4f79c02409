"""Where the offloaded optimizer's host updates run: the CPUs nearest the GPU. The updates
themselves run on a C++ queue (offload/update_queue.hpp) placed on those CPUs."""

from __future__ import annotations

import os

from stowage import _core


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
