"""stowage: train larger models on one GPU with PyTorch.

The C++ core lives in ``stowage._core``; this package is the thin Python layer over it: the
memory API, activation offload (``stowage.offload``), the safe snapshot loader, the trace
recorder (stowage.profiler_snapshot), ``stowage.fit`` (stowage.fitting) and the ``stowage`` command.
"""

from typing import Any

from stowage import offload
from stowage._core import __version__, format_bytes, parse_byte_size
from stowage.memory import (c_library_path, disable, dump_snapshot, empty_cache, enable, is_enabled, mark_step,
                            max_memory_allocated, max_memory_reserved, memory_allocated, memory_reserved, memory_stats,
                            memory_summary, placement_status, record_history, reset_accumulated_stats,
                            reset_peak_stats, snapshot)

__all__ = ["__version__", "c_library_path", "disable", "dump_snapshot", "empty_cache", "enable", "fit", "format_bytes",
           "is_enabled", "mark_step", "max_memory_allocated", "max_memory_reserved", "memory_allocated",
           "memory_reserved", "memory_stats", "memory_summary", "offload", "parse_byte_size", "placement_status",
           "record_history", "reset_accumulated_stats", "reset_peak_stats", "snapshot"]


def __getattr__(name: str) -> Any:
    # stowage.fit needs torch; importing it here would import torch with stowage.
    if name == "fit":
        from stowage.fitting import fit

        return fit
    raise AttributeError(f"module 'stowage' has no attribute {name!r}")
