"""Where the offloaded optimizer's host updates run: the CPUs nearest the GPU (read in C++,
offload/update_queue.hpp, whose queue runs the updates there)."""

from __future__ import annotations

from stowage.serving import torch_module


def cpus_near(pci_bus_id: str | None) -> set[int]:
    """The CPUs this process may use that are nearest the GPU with `pci_bus_id` (all the
    allowed ones when it is None, unknown to hwloc, or shares no CPU with the allowed set)."""
    return set(torch_module().cpus_near(pci_bus_id or ""))
