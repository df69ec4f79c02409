"""Memory and device calls of each trace under stowage, beside PyTorch's allocator, as Markdown.

    python bench/replay/steady_state_table.py [--config CONFIG] [--warmup NAME=STEPS ...] TRACE...

For each trace, on three devices: one with room to spare (1 TiB), a roomy one (1.25 times the
peak of requested bytes) and the smallest one it fits (2 MiB steps, verified):

- stowage's peak reserved on the first two, and the smallest device's size, each as a ratio to
  the peak of requested bytes;
- PyTorch's allocator's peak reserved on the first two (bench/replay/native_rules.py);
- the pages stowage moved (unmapped to be mapped elsewhere), and the device calls it made, after
  warm-up (on the roomy device), with the milliseconds those calls would add to the worst step
  after warm-up under the simulated device's cost model (measured on an H100:
  device/host/host_call_costs.hpp).

Steps end at the trace's mark_step events. Warm-up is the first two steps (the first makes the
optimizer's state, the second is the first to run with it in place) or, when the steps repeat in
a cycle of shapes, two cycles (stowage.replay.step_period), as ``stowage replay`` counts it,
unless ``--warmup`` names another count for a trace. A trace of one step has no steady state to
judge ("-"). Marks: **over** where stowage reserves more than PyTorch, or needs a
device of more than 1.02 times the peak, or calls the device after warm-up.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from native_rules import replay as native_replay  # noqa: E402

from stowage import _core  # noqa: E402
from stowage.replay import min_capacity  # noqa: E402
from stowage.snapshot_reader import load_snapshot_columnar  # noqa: E402
from stowage.replay import device_event_arrays, step_period  # noqa: E402

UNBOUNDED = 1 << 40
ROOMY = 1.25
TIGHT = 1.02


def after_warmup(steps: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    rest = steps[warmup:]
    return {
        "moves": sum(step["unmaps"] for step in rest),
        "calls": sum(step["device_calls"] for step in rest),
        "worst_ms": max((step["charged_ns"] for step in rest), default=0) / 1e6,
        "steps": len(rest),
    }


def measure(name: str, arrays: tuple[Any, ...], config: str, warmup: int | None) -> dict[str, Any]:
    events = _core.ReplayEvents(*arrays)
    unbounded = events.replay(UNBOUNDED, config, measure_latency=False)
    peak = unbounded["peak_requested"]
    roomy = events.replay(int(ROOMY * peak), config, measure_latency=False)
    smallest = min_capacity(events, peak, config, unbounded["peak_reserved"])
    steps = len(roomy["steps"])
    period = step_period(arrays[0], arrays[2])
    warm = warmup if warmup is not None else 2 * (period or 1)
    return {
        "trace": Path(name).name.split(".")[0],
        "peak": peak,
        "reserved": unbounded["peak_reserved"],
        "roomy": roomy["peak_reserved"],
        "roomy_oom": roomy["oom"],
        "smallest": smallest["min_capacity"],
        "native": native_replay(*arrays).peak_reserved,
        "native_roomy": native_replay(*arrays, capacity=int(ROOMY * peak)).peak_reserved,
        "steps": steps,
        "warmup": warm,
        "after": after_warmup(roomy["steps"], warm),
        "unbounded_after": after_warmup(unbounded["steps"], warm),
    }


def cell(value: int | None, peak: int, over: bool) -> str:
    if value is None:
        return "-"
    return f"{value / 2**20:,.0f} ({value / peak:.3f}){' **over**' if over else ''}"


def row(r: dict[str, Any]) -> str:
    peak = r["peak"]
    after = r["after"]
    calls = after["calls"] + r["unbounded_after"]["calls"]
    steady = (f"{after['moves']:,} / {after['calls']:,}{' **over**' if calls else ''} | "
              f"{after['worst_ms']:.2f}" if after["steps"] else "- | -")
    return (f"| {r['trace']} | {peak / 2**20:,.0f} | "
            f"{cell(r['reserved'], peak, r['reserved'] > r['native'])} | "
            f"{cell(r['native'], peak, False)} | "
            f"{cell(r['roomy'], peak, r['roomy'] > r['native_roomy'] or r['roomy_oom'])} | "
            f"{cell(r['native_roomy'], peak, False)} | "
            f"{cell(r['smallest'], peak, r['smallest'] is None or r['smallest'] > TIGHT * peak)} | "
            f"{r['steps']} / {min(r['warmup'], r['steps'])} | {steady} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--config", default="", help="stowage's allocator configuration")
    parser.add_argument("--warmup", action="append", default=[],
                        help="NAME=STEPS: warm-up steps of the trace whose file name starts with NAME")
    args = parser.parse_args()
    warmups = {name: int(steps) for name, steps in (item.split("=", 1) for item in args.warmup)}
    print("| trace | peak requested MiB | stowage reserved, room to spare | PyTorch reserved | "
          "stowage reserved, 1.25x device | PyTorch reserved, 1.25x device | smallest device | "
          "steps / warm-up | page moves / device calls after warm-up | worst step after warm-up, ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.traces:
        warmup = next((steps for prefix, steps in warmups.items()
                       if Path(name).name.startswith(prefix)), None)
        for trace in load_snapshot_columnar(name)["device_traces"]:
            print(row(measure(name, device_event_arrays(trace), args.config, warmup)), flush=True)


if __name__ == "__main__":
    main()
