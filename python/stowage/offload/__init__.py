"""Offload: activations offloaded to host memory during forward and back ahead of backward
(``stowage.offload.activations``), parameters kept on the host and brought in unit by unit
(``stowage.offload.parameters``), and Adam / AdamW with their states in host memory, updated on
the CPU (``stowage.offload.Adam``, ``stowage.offload.AdamW``), imported on first use: their module
imports torch, and ``import stowage`` must not (the import hook installs stowage as torch's
allocator before torch first loads).
"""

from typing import Any

from stowage import _core
from stowage.serving import torch_module
from stowage.offload import activation_offload
from stowage.offload.activation_offload import activations, end_step, stats
from stowage.offload.parameters import OffloadedParameters, ParameterOffloadError, parameters

__all__ = ["Adam", "AdamW", "HostMemoryError", "OffloadReport", "OffloadedParameters", "ParameterOffloadError",
           "activation_offload", "activations", "end_step", "host_room", "parameters", "stats", "summary_lines"]


# The host memory this process may still take: the smallest of MemAvailable, the cgroup's room and
# the limit given (the C++ probe, device/host_memory_probe.hpp, that `stowage doctor` reports too;
# RLIMIT_MEMLOCK bounds what is pinned, not what can be allocated).
host_room = _core.host_room
# The offload part of stowage.memory_summary() (offload/offload_summary.hpp); nothing before anything was offloaded.
summary_lines = _core.offload_summary_lines


def __getattr__(name: str) -> Any:
    if name == "OffloadReport":  # what one activations() region did; stowage._torch's, which imports torch
        return torch_module().OffloadReport
    if name in ("Adam", "AdamW", "HostMemoryError"):
        from stowage.offload import adam  # here: it imports torch (above)

        return getattr(adam, name)
    raise AttributeError(f"module 'stowage.offload' has no attribute {name!r}")
