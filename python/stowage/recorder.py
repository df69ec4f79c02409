"""Deprecated name of stowage.profiler_trace (a CPU workload's memory trace from torch.profiler),
kept for one release."""

import warnings

from stowage.profiler_trace import MARK_STEP, record, save_snapshot

warnings.warn("stowage.recorder is now stowage.profiler_trace; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = ["MARK_STEP", "record", "save_snapshot"]
