"""What host memory the process may really take, read before the offloaded optimizer takes any:
the smallest of MemAvailable, the cgroup's room and the caller's limit (the one probe, in
device/host_memory_probe.hpp, which `stowage doctor` reports too; RLIMIT_MEMLOCK bounds
what is pinned, not what can be allocated)."""

from __future__ import annotations

from stowage import _core


class HostMemoryError(MemoryError):
    """The offloaded optimizer would need more host memory than the process may use."""


def host_room(limit_bytes: int | None = None) -> _core.HostRoom:
    """The host memory this process may still take (the smallest of the limits above);
    `limit_bytes` caps it further. Read by the C++ probe `stowage doctor` reports too."""
    return _core.host_room(limit_bytes)


def check_host_room(needed_bytes: int, what: str, limit_bytes: int | None = None) -> _core.HostRoom:
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
