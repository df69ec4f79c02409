"""How many of the bytes live at each marker of cuda_categories_record.py's snapshots the
inspector puts in the right category (snapshot/categories.hpp, inferred from stacks and lifetimes as
on any stock snapshot), against what the recording script knew.

    python3 bench/inspect/cuda_categories_check.py DIR [--json OUT]

DIR holds the recording's <model>.pickle.gz and truth.json. A live allocation the script did not
know is a temporary (logits, the loss). Prints, per model and marker, the bytes right, the
share, and the largest misplaced allocations.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

from stowage import _core
from stowage.inspection.findings import device_trace, inspect
from stowage.snapshot_reader import ACTION_CODES

CATEGORIES = _core.category_names


def categorised_at_markers(snapshot: dict[str, Any], sizes: dict[str, int]) -> dict[str, dict[int, tuple[str, int]]]:
    """{marker: {address: (inferred category, bytes)}} of the allocations live just before each
    marker's allocation (the first allocation of that size)."""
    columns = device_trace(snapshot, 0)
    allocs = np.flatnonzero(columns.action == ACTION_CODES["alloc"])
    before: dict[str, int] = {}  # each marker's: the event before its allocation
    for marker, size in sizes.items():
        found = allocs[columns.size[allocs] == size]
        if not len(found):
            raise SystemExit(f"no allocation of {size} bytes (the {marker} marker) in the trace")
        before[marker] = int(found[0]) - 1
    moments = inspect(snapshot, 0, 1, moments=list(before.values()))[0].moments
    return {marker: {int(columns.addr[e]): (CATEGORIES[c], int(columns.size[e])) for e, c in
                     zip(moment.events, moment.categories)} for marker, moment in zip(before, moments)}


def compare(inferred: dict[int, tuple[str, int]], known: dict[str, str]) -> dict[str, Any]:
    right = total = 0
    wrong: list[tuple[int, str, str]] = []
    by_truth: dict[str, list[int]] = {}
    for address, (category, size) in inferred.items():
        truth = known.get(str(address), "temporaries")
        total += size
        cell = by_truth.setdefault(truth, [0, 0])
        cell[1] += size
        if category == truth:
            right += size
            cell[0] += size
        else:
            wrong.append((size, truth, category))
    wrong.sort(reverse=True)
    return {"bytes": total, "right": right, "share": right / total if total else 1.0,
            "by_truth": {k: {"right": v[0], "bytes": v[1]} for k, v in sorted(by_truth.items())},
            "largest_wrong": [{"bytes": s, "is": t, "inferred": c} for s, t, c in wrong[:5]]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    truths = json.loads((args.dir / "truth.json").read_text())
    results: dict[str, Any] = {"device": truths["device"], "torch": truths["torch"], "models": {}}
    for name, truth in truths["models"].items():
        snapshot = pickle.loads(gzip.decompress((args.dir / f"{name}.pickle.gz").read_bytes()))
        markers = {m: v["size"] for m, v in truth.items() if isinstance(v, dict)}
        inferred = categorised_at_markers(snapshot, markers)
        results["models"][name] = {m: compare(inferred[m], truth[m]["known"]) for m in markers}
        for marker, found in results["models"][name].items():
            print(f"{name:10s} {marker:15s} {found['right'] / 2**20:9.1f} of {found['bytes'] / 2**20:9.1f} MiB "
                  f"right ({100 * found['share']:5.1f}%)  wrong: "
                  + ", ".join(f"{w['bytes'] / 2**20:.1f} MiB {w['is']} as {w['inferred']}" for w in found["largest_wrong"][:3]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
