"""The exact categories and module paths a snapshot stowage recorded carries (``stowage_tags``,
written by stowage.tagging), read and checked: a field that does not fit is a SnapshotError
naming it, never a wrong answer.

Contract: pure functions; the arrays returned are new.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stowage import _core
from stowage.recompute_estimate import block_of_paths
from stowage.snapshot_reader.errors import SnapshotError
from stowage.snapshot_reader.schema import ACTION_CODES
from stowage.tagging import TAGS_KEY

CATEGORIES: tuple[str, ...] = _core.category_names
TEMPORARIES = CATEGORIES.index("temporaries")
_ALLOC = ACTION_CODES["alloc"]
MAX_PATH = 4096  # characters of a module path kept


@dataclass
class ExactTags:
    """By allocation event (`events`, trace indexes): `category` (CATEGORIES' numbering; what no
    hook saw is a temporary) and `module` (an index into `paths`; 0: made outside any module's
    forward); `block_of_path` each path's block in `blocks` (stowage.recompute_estimate; -1:
    none)."""

    events: np.ndarray
    category: np.ndarray
    module: np.ndarray
    paths: list[str]
    block_of_path: np.ndarray
    blocks: list[str]

    def as_tuple(self) -> tuple[Any, ...]:
        """The arguments of stowage._core.inspect's `tags`."""
        return self.events, self.category, self.module, self.paths, self.block_of_path, self.blocks


def _int_list(value: Any, where: str, low: int, high: int) -> np.ndarray:
    if not isinstance(value, list):
        raise SnapshotError(f"{where}: expected a list, got {type(value).__name__}")
    try:
        out = np.array(value, dtype=np.int64) if all(type(v) is int for v in value) else None  # noqa: E721
    except OverflowError:
        out = None
    bad = [i for i, v in enumerate(value) if type(v) is not int or not low <= v < high] if out is None else \
        np.flatnonzero((out < low) | (out >= high)).tolist()  # noqa: E721
    if bad:
        raise SnapshotError(f"{where}[{bad[0]}]: expected an integer in [{low}, {high}), got {value[bad[0]]!r:.40}")
    return out


def read(snapshot: dict[str, Any], device: int, action: np.ndarray) -> ExactTags | None:
    """The device's tags (`action`: its trace's action codes); None when the snapshot carries none
    for it."""
    tags = snapshot.get(TAGS_KEY)
    if tags is None:
        return None
    if not isinstance(tags, dict):
        raise SnapshotError(f"{TAGS_KEY}: expected a dict, got {type(tags).__name__}")
    found = tags.get(str(device))
    if found is None:
        return None
    where = f"{TAGS_KEY}.{device}"
    if not isinstance(found, dict) or found.get("format") != 1:
        raise SnapshotError(f"{where}: expected a dict of format 1")
    names, paths = found.get("categories"), found.get("modules")
    if not isinstance(names, list) or any(name not in CATEGORIES for name in names):
        raise SnapshotError(f"{where}.categories: expected a list of {', '.join(CATEGORIES)}")
    if not isinstance(paths, list) or not paths or any(not isinstance(p, str) for p in paths):
        raise SnapshotError(f"{where}.modules: expected a non-empty list of strings")
    events = _int_list(found.get("events"), f"{where}.events", 0, len(action))
    category = _int_list(found.get("category"), f"{where}.category", -1, len(names))
    module = _int_list(found.get("module"), f"{where}.module", 0, len(paths))
    if not len(events) == len(category) == len(module):
        raise SnapshotError(f"{where}: events, category and module differ in length "
                            f"({len(events)}, {len(category)}, {len(module)})")
    not_alloc = np.flatnonzero(action[events] != _ALLOC)
    if len(not_alloc):
        i = int(not_alloc[0])
        raise SnapshotError(f"{where}.events[{i}]: event {int(events[i])} is not an allocation")
    numbering = np.array([CATEGORIES.index(name) for name in names] + [TEMPORARIES], dtype=np.int8)
    kept = [p[:MAX_PATH] for p in paths]
    block_of_path, blocks = block_of_paths(kept)
    return ExactTags(events, numbering[category], module, kept, block_of_path, blocks)  # (-1: untagged, the last)


def read_tags(snapshot: dict[str, Any], device: int, action: np.ndarray) -> tuple[Any, ...] | None:
    """`read`'s tags as stowage._core.inspect takes them."""
    found = read(snapshot, device, action)
    return found.as_tuple() if found is not None else None
