"""Live bytes over a trace by group, sampled, for the HTML report's timelines: by allocation
site, by what each allocation is (stowage's tags, else inferred: snapshot/categories.hpp), and by
module where stowage's tags name them. The sampling is C++ (snapshot/live_groups.hpp's
grouped_live), and so is the pairing of allocations and frees (snapshot/live_pairs.hpp).

A site is a stack's innermost user frame (file:line in function; frames of torch and of
Python's own library left out), else its innermost Python frame, else the allocation's size
class (snapshot/frame_sites.hpp names them so for the findings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stowage import _core
from stowage.inspection import tags as tag_reading
from stowage.snapshot_reader import TraceColumns
from stowage.trace import as_columns

MAX_POINTS = 1500      # timeline samples
MAX_SITES = 8          # sites drawn by name in the timeline; the rest are "other"
CATEGORIES = tag_reading.CATEGORIES

_LIBRARY_PARTS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen ", "/torch/")


def _is_user_frame(frame: dict[str, Any]) -> bool:
    filename = str(frame.get("filename", ""))
    if not filename.endswith(".py"):
        return False  # C++ frames and frames without a file
    return not any(part in filename for part in _LIBRARY_PARTS)


def frame_site(frames: list[dict[str, Any]] | None) -> str | None:
    """A stack's innermost user frame (file:line in function), else its innermost Python frame;
    None when it has neither."""
    if frames:
        for frame in frames:
            if _is_user_frame(frame):
                return f"{frame['filename']}:{frame.get('line', 0)} in {frame.get('name', '?')}"
        for frame in frames:
            if str(frame.get("filename", "")).endswith(".py"):
                return f"{frame['filename']}:{frame.get('line', 0)} in {frame.get('name', '?')}"
    return None


def site_of(frames: list[dict[str, Any]] | None, size: int) -> str:
    """Where an allocation came from: frame_site, else its size class."""
    site = frame_site(frames)
    return site if site is not None else size_class(size)


def size_class(size: int) -> str:
    """Requests by powers of four: 'size 64 KiB-256 KiB' and so on."""
    if size <= 512:
        return "size <= 512 B"
    low = 512
    while low * 4 < size:
        low *= 4
    return f"size {_core.format_bytes(low)}-{_core.format_bytes(low * 4)}"


def _size_classes(sizes: np.ndarray) -> np.ndarray:
    """size_class for many sizes at once, as numbers: -1 for <= 512 B, else k for 512 * 4**k to
    512 * 4**(k + 1) (the smallest k with 2**(11 + 2k) >= size)."""
    _, bits = np.frexp((sizes.astype(np.int64) - 1).astype(np.float64))  # bit lengths (sizes < 2**50)
    return np.where(sizes <= 512, -1, np.maximum(0, (bits.astype(np.int64) - 10) // 2))


@dataclass
class LivePairs:
    """A trace's alloc and free_completed events ("positions" 0..n-1, in order), each free
    matched with the allocation it ends as a dict from address to size would match it: a free
    ends the latest allocation of its address if no free came between them; otherwise it frees
    memory that was live before the trace began (an "unknown" free). An allocation whose address
    is allocated again before any free is never ended."""

    index: np.ndarray  # the events' indexes in the trace (positions are int32 below 2**31 events)
    is_alloc: np.ndarray
    size: np.ndarray  # int64, or Python ints (object) where sums could overflow
    own: np.ndarray  # change of the trace's own live bytes: +size, or minus the ended allocation's
    unknown: np.ndarray  # the size of each unknown free, else 0
    alloc_of: np.ndarray  # for a matched free, the position of the allocation it ends, else -1
    end: np.ndarray  # for an allocation, the position of the free that ends it, else n


def live_pairs(columns: TraceColumns) -> LivePairs:
    """The trace's LivePairs, paired in C++ (snapshot/live_pairs.hpp)."""
    index, is_alloc, size, own, unknown, alloc_of, end = _core.live_pairs(columns.action, columns.addr, columns.size)
    if len(size) and float(size.sum(dtype=np.float64)) >= 2.0**62:  # running sums could pass int64: Python's integers
        size, own, unknown = size.astype(object), own.astype(object), unknown.astype(object)
    return LivePairs(index, is_alloc, size, own, unknown, alloc_of, end)


class TraceSites:
    """The site of each allocation in LivePairs (site_of its frames and size), as small
    integers: `of[position]` (-1 for frees), `names[id]`, and `first[id]`, the position of the
    site's first allocation (the order a dict filled in trace order lists them)."""

    def __init__(self, columns: TraceColumns, pairs: LivePairs) -> None:
        allocs = np.flatnonzero(pairs.is_alloc)
        stack = columns.stack[pairs.index[allocs]]
        ids: dict[str, int] = {}
        by_stack = np.full(len(columns.stacks) + 1, -1, dtype=np.int64)  # the last: no stack
        for s in np.unique(stack[stack >= 0]).tolist():
            name = frame_site(columns.stacks[s])
            if name is not None:
                by_stack[s] = ids.setdefault(name, len(ids))
        site = by_stack[np.where(stack >= 0, stack, len(columns.stacks))]
        by_class = site < 0
        classes = _size_classes(columns.size[pairs.index[allocs[by_class]]])
        found = np.unique(classes)
        if len(found):
            class_ids = np.array([ids.setdefault(size_class(512 * 4**k + 1 if k >= 0 else 512), len(ids))
                                  for k in found.tolist()], dtype=np.int64)
            site[by_class] = class_ids[np.searchsorted(found, classes)]
        self.names: list[str] = list(ids)
        self.of = np.full(len(pairs.index), -1, dtype=pairs.index.dtype)
        self.of[allocs] = site
        self.first = np.full(len(self.names), len(pairs.index), dtype=np.int64)
        np.minimum.at(self.first, site, allocs)


def all_categories(columns: TraceColumns, pairs: LivePairs, step_starts: np.ndarray) -> np.ndarray:
    """Every allocation's category (int8 by LivePairs position; unknown at frees; C++:
    snapshot/advice_evidence.hpp), autograd's thread's events marked backward's; unknown
    throughout where the trace has no Python frames to read."""
    flags = np.append(_core.stack_flags(columns.stacks), np.zeros(2, dtype=np.int8))[columns.stack[pairs.index]]
    if not _core.mark_autograd_thread(flags, columns.stack, pairs.index, pairs.is_alloc):
        return np.full(len(pairs.index), CATEGORIES.index("unknown"), dtype=np.int8)
    return _core.all_categories(flags, columns.stack, pairs.index, pairs.is_alloc, pairs.end, step_starts)


def live_positions(pairs: LivePairs, position: int) -> np.ndarray:
    """The allocations live just after `position` (LivePairs positions; none before the first)."""
    head = slice(0, max(position + 1, 0))
    return np.flatnonzero(pairs.is_alloc[head] & (pairs.end[head] > position))


def tags_by_position(exact: tag_reading.ExactTags, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tags' category and module by LivePairs position (`index`: the positions' events)."""
    position = np.searchsorted(index, exact.events)  # every alloc event is a LivePairs position
    category = np.full(len(index), tag_reading.TEMPORARIES, dtype=np.int8)
    module = np.zeros(len(index), dtype=np.int64)
    category[position] = exact.category
    module[position] = exact.module
    return category, module


def timeline(trace: TraceColumns | Sequence[dict[str, Any]], baseline: int, named: list[str],
             pairs: LivePairs | None = None) -> dict[str, Any]:
    """Live bytes by site, sampled: at most MAX_POINTS samples, always including the peak. As in
    the findings (snapshot/trace_findings.hpp), bytes live before the trace began start at `baseline` and drop with
    each free of an address the trace never allocated. (`pairs`: the trace's, when known.)"""
    columns = as_columns(trace)
    pairs = live_pairs(columns) if pairs is None else pairs
    if len(pairs.index) == 0:
        return {"x": [], "series": {}, "peak_index": -1}
    sites = TraceSites(columns, pairs)
    index_of_site = {site: k for k, site in enumerate(named)}
    series_of_site = np.array([index_of_site.get(site, len(named)) for site in sites.names] + [-1], dtype=np.int64)
    return grouped(pairs, series_of_site[sites.of], [*named, "other"], baseline)


def grouped(pairs: LivePairs, group: np.ndarray, names: list[str], baseline: int) -> dict[str, Any]:
    """Live bytes by group, sampled as `timeline`'s: `group` gives each allocation's (an index
    into `names`; frees' entries are ignored: a free leaves its allocation's group)."""
    if len(pairs.index) == 0:
        return {"x": [], "series": {}, "peak_index": -1}
    positions, peak_at, freed, series = _core.grouped_live(pairs.own, pairs.unknown, pairs.is_alloc, pairs.alloc_of,
                                                           group, len(names), MAX_POINTS)  # (snapshot/live_groups.hpp)
    values: dict[str, list[int]] = {}
    if baseline:
        values["(live before the trace began)"] = [max(baseline - v, 0) for v in freed]
    values.update(zip(names, series))
    return {"x": pairs.index[positions].tolist(), "series": values, "peak_index": int(pairs.index[peak_at])}


def category_and_module_timelines(snapshot: dict[str, Any], device: int, columns: TraceColumns, pairs: LivePairs,
                                  report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Live bytes by category (exact where stowage tagged the snapshot, else inferred, with the
    report's steps), and by module where it carries module paths (None otherwise): by block
    (stowage.recompute_estimate's blocks, each a model's item of its block list) and, outside
    blocks, by module to three names deep; the MAX_SITES that allocate most, the rest together."""
    baseline = report["peak"]["baseline"]
    exact = tag_reading.read(snapshot, device, columns.action)
    if exact is not None:
        category, module = tags_by_position(exact, pairs.index)
    else:
        firsts = np.array([step["first_event"] for step in report.get("steps") or []], dtype=np.int64)
        category = all_categories(columns, pairs, np.searchsorted(pairs.index, firsts))
    by_category = grouped(pairs, category, list(CATEGORIES), baseline)
    by_category["series"] = {k: v for k, v in by_category["series"].items() if any(v)}
    if exact is None:
        return by_category, None
    block, blocks = exact.block_of_path, exact.blocks
    group_names = [blocks[b] if b >= 0 else _prefix(p, 3) for p, b in zip(exact.paths, block.tolist())]
    group_names[0] = "(outside any module's forward)"
    distinct = sorted(set(group_names))
    group = np.array([distinct.index(g) for g in group_names], dtype=np.int64)[module]
    made = np.zeros(len(distinct), dtype=np.float64)
    np.add.at(made, group[pairs.is_alloc], np.asarray(pairs.size[pairs.is_alloc], dtype=np.float64))
    shown = [int(g) for g in np.argsort(-made, kind="stable")[:MAX_SITES] if made[g] > 0]
    names = [distinct[g] for g in shown] + ["other modules"]
    remap = np.full(len(distinct), len(shown), dtype=np.int64)
    remap[shown] = np.arange(len(shown))
    by_module = grouped(pairs, remap[group], names, baseline)
    by_module["series"] = {k: v for k, v in by_module["series"].items() if any(v)}
    return by_category, by_module


def _prefix(path: str, depth: int) -> str:
    return ".".join(path.split(".")[:depth])
