"""Advice the inspector gives: each rule names a waste it sees in the trace, the bytes the peak
would lose without it, and the call that removes it. The rules, their re-simulated savings, when
each fires (MIN_SHARE) and their wording are C++ (snapshot/advice.hpp says each); this module
hands them what the inspector found.

Contract: a pure function of the inspector's findings and the trace's LivePairs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stowage import _core, recompute_estimate
from stowage.snapshot_reader.columns import TraceColumns

MIN_SHARE: float = _core.advice_min_share  # the share of the peak a waste must reach
LOSS_CHUNKS: int = _core.advice_loss_chunks  # the chunks a chunked loss is advised in


def advise(columns: TraceColumns, pairs: Any, sites: Any, flags: tuple[np.ndarray, np.ndarray | None],
           live: np.ndarray, peak: dict[str, Any], at: int, at_peak: tuple[np.ndarray, np.ndarray],
           step_starts: np.ndarray, exact: Any, growing: list[dict[str, Any]],
           ooms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules' advice, largest saving first: over the trace's LivePairs `pairs`, its sites
    (inspector's TraceSites), its positions' stack flags and trace flags (categories.both_flags),
    its live-bytes series, the peak (`peak`, at LivePairs position `at`, with the positions live
    there and their categories), where steps begin, stowage's tags
    (tag_reading.ExactTags, or None), the sites growing every step and the run's OOMs (with the
    cache's free bytes, `cached_free`, and `under_stowage`: stowage's allocator recorded them)."""
    by_position, marked = flags
    block, blocks = None, []
    if exact is not None:
        of_path, blocks = recompute_estimate.block_of_paths(exact.paths)
        block = of_path[exact.module]
    ids: dict[str, int] = {}
    for i, name in enumerate(sites.names):
        ids.setdefault(name, i)
    oom = next(((o["requested"], o["device_free"], o.get("cached_free", 0), o.get("stowage_peak_reserved"),
                 bool(o.get("under_stowage", False))) for o in ooms), None)
    return _core.advise(live, pairs.is_alloc, pairs.end, pairs.size, pairs.own, pairs.index, columns.stack, by_position,
                        marked, step_starts, sites.of,
                        exact.category if exact is not None else None, block, len(blocks),
                        blocks[0] if blocks else "", max(int(peak["live_bytes"]), 1), at, at_peak[0], at_peak[1],
                        peak.get("categories", {}),
                        [(ids.get(r["site"], -1), r["site"], r["bytes_per_step"], r["steps"]) for r in growing], oom)
