"""What host memory the process may really take, read before the offloaded optimizer takes any.

Three limits apply, and the smallest wins: the memory the kernel says is available
(``MemAvailable``), the cgroup's limit less what the cgroup already uses (v2 ``memory.max``, or
v1 ``memory.limit_in_bytes``), and a limit the caller gives (``host_memory_limit=``, also how
tests simulate a small host). Pinning has one more, ``RLIMIT_MEMLOCK``: beyond it the host refuses
to lock pages, and the pool falls back to pageable memory with one warning, so it bounds how much
is pinned, not what can be allocated.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from stowage import _core

_CGROUP_ROOT = Path("/sys/fs/cgroup")


class HostMemoryError(MemoryError):
    """The offloaded optimizer would need more host memory than the process may use."""


@dataclass(frozen=True)
class HostRoom:
    """Bytes the process may still take, and which limit set it."""

    available_bytes: int
    limited_by: str
    lockable_bytes: int | None  # RLIMIT_MEMLOCK; None: unlimited


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("max", "") else int(text)


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _own_cgroup() -> Path | None:
    """The v2 cgroup directory of this process, if the unified hierarchy is mounted."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, _, path = line.split(":", 2)
            if hierarchy == "0":
                return _CGROUP_ROOT / path.lstrip("/")
    except (OSError, ValueError):
        return None
    return None


def _cgroup_room() -> int | None:
    """The cgroup's limit less its usage: v2, else v1; None when there is no limit."""
    group = _own_cgroup()
    if group is not None:
        limit = _read_int(group / "memory.max")
        usage = _read_int(group / "memory.current")
        if limit is not None and usage is not None:
            return max(0, limit - usage)
    limit = _read_int(_CGROUP_ROOT / "memory" / "memory.limit_in_bytes")
    usage = _read_int(_CGROUP_ROOT / "memory" / "memory.usage_in_bytes")
    if limit is not None and usage is not None and limit < (1 << 60):
        return max(0, limit - usage)
    return None


def host_room(limit_bytes: int | None = None) -> HostRoom:
    """The host memory this process may still take; `limit_bytes` caps it further."""
    candidates: list[tuple[int, str]] = []
    available = _mem_available()
    if available is not None:
        candidates.append((available, "available host memory (MemAvailable)"))
    cgroup = _cgroup_room()
    if cgroup is not None:
        candidates.append((cgroup, "the cgroup's memory limit"))
    if limit_bytes is not None:
        candidates.append((limit_bytes, "host_memory_limit"))
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    lockable = None if soft == resource.RLIM_INFINITY else int(soft)
    if not candidates:
        return HostRoom(1 << 62, "nothing (no limit could be read)", lockable)
    available_bytes, limited_by = min(candidates)
    return HostRoom(available_bytes, limited_by, lockable)


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
