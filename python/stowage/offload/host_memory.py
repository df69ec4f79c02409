"""What host memory the process may really take, read before the offloaded optimizer takes any:
the smallest of MemAvailable, the cgroup's room and the caller's limit (offload/host_room.hpp,
which reads them; RLIMIT_MEMLOCK bounds what is pinned, not what can be allocated)."""

from __future__ import annotations

from dataclasses import dataclass

from stowage import _core


class HostMemoryError(MemoryError):
    """The offloaded optimizer would need more host memory than the process may use."""


@dataclass(frozen=True)
class HostRoom:
    """Bytes the process may still take, and which limit set it."""

    available_bytes: int
    limited_by: str
    lockable_bytes: int | None  # RLIMIT_MEMLOCK; None: unlimited


def host_room(limit_bytes: int | None = None) -> HostRoom:
    """The host memory this process may still take; `limit_bytes` caps it further."""
    from stowage.memory import _torch_module

    return HostRoom(*_torch_module().host_room(limit_bytes))


def check_host_room(needed_bytes: int, what: str, limit_bytes: int | None = None) -> HostRoom:
    """Raises HostMemoryError, with the bytes needed and available, when `needed_bytes` do not
    fit in what the process may take."""
    room = host_room(limit_bytes)
    if needed_bytes > room.available_bytes:
        f = _core.format_bytes
        raise HostMemoryError(
            f"{what} needs {f(needed_bytes)} of host memory ({needed_bytes} bytes) but the "
            f"process may take only {f(room.available_bytes)} ({room.available_bytes} bytes), set by "
            f"{room.limited_by}. Keep more states on the device (device_fraction=), offload fewer "
            "parameters, or free host memory.")
    return room
