"""fit's decisions on fit_batches' table (bench/e2e/fit_batches.py), two builds of stowage
interleaved: for each model, stowage.fit is given the global batch G of the table and decides,
once with the older build (``--before-tree``, its checkout, with ``--before-python``, an
interpreter that imports that build) and once with this one, alternating run by run (which goes
first alternates too), each in a fresh process, so that the machine's noise falls on both alike.

    python3 bench/e2e/fit_batches_before_after.py --before-tree OLD --before-python OLD_VENV/bin/python

Every run gets the same cost model (``COST``: fit measures none), so that a plan depends on the
build and the step's recorded op times only; those move a plan from run to run (an idle machine's
runs of one build differ), so ``--fixed-times`` times every op and probe 0.1 ms. Reported per model and build: the choice (share of
states on the device, micro-batches x rows, loss units), the plan's decisions (keep / offload /
recompute per saved tensor, as a count and a digest), every option's line of fit's table (its predicted time left out), and the time fit
took to decide, each run's. A model whose decisions differ between the builds is marked.
No step is trained: only the decision is compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# G of each model at 24 B a parameter (bench/results/2026-11-26-cpu-fit-batches.md), and its device.
TABLE = {"llama": (20, "157MiB"), "gpt2": (8, "134MiB"), "hf_llama": (12, "148MiB"), "mistral": (12, "148MiB"),
         "qwen2": (12, "148MiB"), "opt": (8, "134MiB"), "bert": (16, "136MiB"), "t5": (16, "193MiB"),
         "vit": (32, "112MiB")}
COST = {"to_host_bytes_per_ms": 2.0e6, "to_device_bytes_per_ms": 2.0e6, "prefetch_depth": 2}

# Runs in the child, with the build's own checkout on the path: the table's model, fit's decision.
CHILD = r"""
import argparse, contextlib, io, json, sys, time
sys.path.insert(0, sys.argv[1] + "/bench/e2e")
from fit_batches import _setup
args = argparse.Namespace(model=sys.argv[2], capacity=sys.argv[3])
torch, model, batches, loss_fn, kind = _setup(args)
if sys.argv[6] == "fixed":  # every interval timed by perf_counter (an op, a probe) 0.1 ms long
    ticks = iter(range(1, 1 << 62))
    time.perf_counter = lambda: next(ticks) * 1e-4
import stowage
batch = batches(int(sys.argv[4]))
table = io.StringIO()
started = time.monotonic()
with contextlib.redirect_stdout(table):
    fitted = stowage.fit(model, lambda ps: torch.optim.AdamW(ps, lr=1e-4), batch, loss_fn=loss_fn,
                         micro_batches="auto", split_batchnorm=True, cost=json.loads(sys.argv[5]))
decision_s = time.monotonic() - started
plan = fitted.plan
decisions = [str(getattr(d, "name", d)).lower() for d in plan.decisions] if plan is not None else []
print(json.dumps({"decision_s": decision_s, "device_fraction": fitted.device_fraction,
                  "micro_batches": fitted.chosen.micro_batches, "micro_rows": fitted.chosen.micro_rows,
                  "units": fitted.units.name if fitted.units else None, "decisions": decisions,
                  "table": table.getvalue()}))
"""


def decide(python: str, tree: str, model: str, rows: int, capacity: str, times: str) -> dict[str, Any]:
    done = subprocess.run([python, "-c", CHILD, tree, model, capacity, str(rows), json.dumps(COST), times],
                          capture_output=True, text=True, check=False, cwd=tree)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{model} with {python} failed:\n{done.stderr[-3000:]}")
    found = json.loads(lines[-1])
    lines = found.pop("table").splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("states on the device"))
    found["options"] = [re.sub(r"\s+", " ", re.sub(r"\d+ ms", "T ms", line)).strip()
                        for line in lines[header + 1:] if line.strip()]
    counts = {d: found["decisions"].count(d) for d in sorted(set(found["decisions"]))}
    found["plan"] = f"{counts} #{hashlib.sha1(' '.join(found.pop('decisions')).encode()).hexdigest()[:8]}"
    return found


def choice(found: dict[str, Any]) -> tuple[Any, ...]:
    return (found["device_fraction"], found["micro_batches"], found["micro_rows"], found["units"], found["plan"],
            tuple(found["options"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-tree", required=True, help="the older build's checkout")
    parser.add_argument("--before-python", required=True, help="an interpreter that imports the older build")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=sorted(TABLE), default=list(TABLE))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--fixed-times", action="store_true",
                        help="every op and probe timed 0.1 ms (perf_counter replaced in the child), so that the "
                             "step's measured times, which move the plan run to run, are the same in every run")
    args = parser.parse_args()
    builds = {"before": (args.before_python, args.before_tree), "after": (sys.executable, str(HERE.parents[1]))}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    print("| model | G | build | states on device | micro-batches x rows | units | plan | options (refused) "
          "| decided in (s, each run) | same |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        rows, capacity = TABLE[model]
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for run in range(args.runs):
            for build in (("before", "after") if run % 2 == 0 else ("after", "before")):
                runs[build].append(decide(*builds[build], model, rows, capacity,
                                          "fixed" if args.fixed_times else "measured"))
        results[model] = runs
        same = {choice(r) for r in runs["before"]} == {choice(r) for r in runs["after"]}
        for build in ("before", "after"):
            first = runs[build][0]
            times = ", ".join(f"{r['decision_s']:.1f}" for r in runs[build])
            print(f"| {model} | {rows} | {build} | {first['device_fraction']:.0%} | {first['micro_batches']} x "
                  f"{first['micro_rows']} | {first['units']} | {first['plan']} | {len(first['options'])} ({sum(not o.endswith('T ms') and '<-' not in o for o in first['options'])}) | {times} "
                  f"| {'yes' if same else 'NO'} |", flush=True)
    medians = {b: statistics.median(r["decision_s"] for m in results.values() for r in m[b]) for b in builds}
    print(f"\nmedian decision time: before {medians['before']:.1f} s, after {medians['after']:.1f} s "
          f"(after / before {medians['after'] / medians['before']:.2f})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
