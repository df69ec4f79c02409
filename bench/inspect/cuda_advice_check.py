"""The inspector's advice on cuda_advice_record.py's stock CUDA snapshots: for each rule that
names a fix the recording measured, the saving predicted from the snapshot against the saving
measured on the GPU (the loop's peak less the fixed loop's).

    python3 bench/inspect/cuda_advice_check.py DIR [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import sys
from pathlib import Path
from typing import Any

from stowage.inspection.findings import inspect_device

FIXES = {"logits at the peak": "chunked", "forward without backward": "no_grad",
         "gradients kept across steps": "set_to_none", "memory growing every step": "detach"}


def compared(snapshot: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    report = inspect_device(snapshot, 0, 5)
    rows = []
    for advice in report["advice"]:
        fix = FIXES.get(advice["rule"])
        row = {"rule": advice["rule"], "predicted_bytes": advice["saving_bytes"], "fix": fix,
               "upper_bound": advice.get("upper_bound", False), "peak_bytes": run["peak"],
               "traced_peak_bytes": report["peak"]["live_bytes"]}
        if fix in run["fixed"]:
            row["measured_bytes"] = run["peak"] - run["fixed"][fix]
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    snapshots = pickle.loads(gzip.decompress((args.dir / "advice_snapshots.pickle.gz").read_bytes()))
    peaks = json.loads((args.dir / "advice_peaks.json").read_text())
    results: dict[str, Any] = {"device": peaks["device"], "torch": peaks["torch"], "runs": {}}
    for key, run in peaks["runs"].items():
        results["runs"][key] = rows = compared(snapshots[key], run)
        for row in rows:
            measured = row.get("measured_bytes")
            told = f"measured {measured / 2**20:9.1f} MiB ({100 * (row['predicted_bytes'] - measured) / max(measured, 1):+6.1f}%)" \
                if measured is not None else "not measured" + (" (an upper bound)" if row["upper_bound"] else "")
            print(f"{key:24s} {row['rule']:28s} predicted {row['predicted_bytes'] / 2**20:9.1f} MiB  {told}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
