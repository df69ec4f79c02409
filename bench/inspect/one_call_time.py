"""The inspector's time on one snapshot, two stowage packages against each other in interleaved
runs: each run a fresh interpreter that loads the snapshot (the safe loader, timed apart) and
makes the report `stowage inspect --json` prints (timed: the findings and their JSON form), then
prints it; the reports of the two must be identical.

    python3 bench/inspect/one_call_time.py SNAPSHOT --old DIR [--new DIR] [--runs 11]

DIR is put first on PYTHONPATH (a copy of an installed stowage package's parent directory; no
--new: the installed one). Prints the medians, and each run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

RUN = r"""
import json, sys, time
from pathlib import Path
from stowage.snapshot_reader import load_snapshot_columnar
try:
    from stowage.inspection.findings import inspect_device
except ImportError:  # a package from before the one call (main at f1ac9e6 and earlier)
    from stowage.inspector import inspect_device
started = time.perf_counter()
snapshot = load_snapshot_columnar(Path(sys.argv[1]))
loaded = time.perf_counter()
report = json.dumps(inspect_device(snapshot, 0, 10))
done = time.perf_counter()
print(json.dumps({"load_s": loaded - started, "inspect_s": done - loaded, "report": report}))
"""


def one(path: str, pythonpath: str | None) -> dict[str, float | str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-c", RUN, path], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot")
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default=None)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float | str]]] = {"old": [], "new": []}
    for _ in range(args.runs):
        for name, where in (("old", args.old), ("new", args.new)):
            runs[name].append(one(args.snapshot, where))
    assert runs["old"][0]["report"] == runs["new"][0]["report"], "the two reports differ"
    for name, rows in runs.items():
        load = statistics.median(float(r["load_s"]) for r in rows)
        inspect = statistics.median(float(r["inspect_s"]) for r in rows)
        each = ", ".join(f"{float(r['inspect_s']):.3f}" for r in rows)
        print(f"{name}: median load {load:.3f} s, median findings + JSON {inspect:.3f} s (runs: {each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
