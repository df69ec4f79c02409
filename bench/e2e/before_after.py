"""fit's CPU table, two builds of stowage interleaved: each point of bench/e2e/fit_search.py's table
probed by bench/e2e/fit_probe.py (a fresh process a point) with the build installed in the
environment ("after") and with another build put first on the path (``--before DIR``, a
``pip install --target DIR`` of the older commit), alternating run by run, so that the machine's
noise falls on both alike. Prints, per point and build, every run's step times, the median over
runs of each run's median steady step (steps after the first two), and after / before.

    pip install --no-deps --no-build-isolation --target /tmp/stowage-before <old checkout>
    python3 bench/e2e/before_after.py --before /tmp/stowage-before --runs 5 --json out.json

``--cost JSON`` gives every fit the same cost model (fit_probe's ``--cost``): without it each run
measures its own, and plans differ between runs of one build. ``--points`` picks points of the
table by index.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

PROBE = Path(__file__).resolve().parent / "fit_probe.py"
# The table's stowage rows (bench/results/2026-11-24-cpu-fit.md) at points every build trains:
# (configuration, layers, batch of 256-token rows).
POINTS = (("stowage+plan+optimizer", 6, 4), ("stowage+plan", 4, 4), ("stowage+offload", 4, 4),
          ("stowage+plan+optimizer", 4, 12))


def probe(config: str, layers: int, batch: int, before: str | None, cost: str | None) -> dict[str, Any]:
    environment = dict(os.environ)
    if before is not None:  # its compiled modules find torch's libraries by a path relative to site-packages
        torch_lib = str(Path(importlib.util.find_spec("torch").origin).parent / "lib")
        environment["PYTHONPATH"] = before + os.pathsep + environment.get("PYTHONPATH", "")
        environment["LD_LIBRARY_PATH"] = torch_lib + os.pathsep + environment.get("LD_LIBRARY_PATH", "")
    done = subprocess.run([sys.executable, str(PROBE), "--config", config, "--device", "cpu", "--capacity", "160MiB",
                           "--layers", str(layers), "--batch", str(batch), "--steps", "6"]
                          + (["--cost", cost] if cost else []),
                          capture_output=True, text=True, env=environment, check=False)
    if done.returncode != 0:
        raise SystemExit(f"fit_probe failed ({config}, {layers} layers, batch {batch}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="a directory holding the older build's stowage package")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cost", help="the cost model every fit is given, as JSON")
    parser.add_argument("--points", type=int, nargs="+", default=list(range(len(POINTS))),
                        help="indices into POINTS (default: all)")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for config, layers, batch in (POINTS[index] for index in args.points):
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for run in range(args.runs):
            for build in (("before", "after") if run % 2 == 0 else ("after", "before")):
                runs[build].append(probe(config, layers, batch, args.before if build == "before" else None,
                                         args.cost))
        row: dict[str, Any] = {"config": config, "layers": layers, "batch": batch, "cost": args.cost}
        for build, probes in runs.items():
            steady = [statistics.median(p["step_s"][2:]) for p in probes if p.get("fits")]
            row[build] = {"fits": [bool(p.get("fits")) for p in probes],
                          "step_ms": [[round(1000 * s, 1) for s in p.get("step_s", [])] for p in probes],
                          "median_steady_ms": round(1000 * statistics.median(steady), 1) if steady else None}
        if row["before"]["median_steady_ms"] and row["after"]["median_steady_ms"]:
            row["after_over_before"] = round(row["after"]["median_steady_ms"] / row["before"]["median_steady_ms"], 4)
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
