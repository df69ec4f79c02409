"""The largest model and the most tokens a step that train on one device, and their throughput, for
each configuration of bench/e2e/fit_probe.py: stock PyTorch, with full activation checkpointing,
with expandable segments (GPU), stowage's allocator alone, with activation offload, with the
planner, with the planner and the offloaded optimizer.

    python3 bench/e2e/fit_search.py --device cpu --capacity 160MiB [--configs ...] [--json OUT]

Two searches per configuration, each point a fresh process (fit_probe.py):
  model   the most layers of a Llama-style decoder (hidden --hidden) at --batch x --seq tokens;
  tokens  the largest batch of --seq tokens for the model of --layers layers.
Each search brackets (doubling from --start until a point fails) and then bisects between the last
point that trained and the first that did not, so it probes about 2 log2(answer) points. The table
gives each answer (parameters, tokens a step), the tokens a second there (median over the steps
after the first two) and every step's time; the JSON adds each probe's load averages before and
after it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
CPU_CONFIGS = ("torch", "torch+checkpoint", "stowage+offload", "stowage+plan", "stowage+plan+optimizer")
GPU_CONFIGS = ("torch", "torch+checkpoint", "torch+expandable", "stowage", "stowage+offload", "stowage+plan",
               "stowage+plan+optimizer")


def probe_in_process(command: list[str], timeout: float, point: dict[str, Any]) -> dict[str, Any]:
    """Runs one probe command in a fresh process: the JSON line it prints last, or `point` marked
    as not fitting with why (the exit status and the output's last line)."""
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**point, "fits": False, "why": f"exit status {completed.returncode}: {tail[0][:300]}"}
    return dict(json.loads(lines[-1]))


def run_probe(args: argparse.Namespace, config: str, layers: int, batch: int) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "fit_probe.py"), "--config", config, "--device", args.device,
               "--capacity", args.capacity, "--hidden", str(args.hidden), "--heads", str(args.heads),
               "--kv-heads", str(args.kv_heads), "--vocab", str(args.vocab), "--layers", str(layers),
               "--batch", str(batch), "--seq", str(args.seq), "--steps", str(args.steps)]
    load_before = _load()
    result = probe_in_process(command, args.probe_timeout, {"config": config, "layers": layers, "batch": batch})
    return {**result, "load_before": load_before, "load_after": _load()}


def _load() -> list[float]:
    """The host's load averages (1, 5, 15 minutes): how busy the machine was around a probe."""
    return [round(value, 2) for value in os.getloadavg()]


def search(probe: Callable[[int], dict[str, Any]], start: int, limit: int) -> tuple[dict[str, Any] | None, list[dict]]:
    """The largest n in [start, limit] whose probe fits (fits is taken to fall as n grows), by
    doubling from `start`, then bisecting; (its probe or None, every probe in order)."""
    probes: list[dict[str, Any]] = []

    def fits(n: int) -> dict[str, Any] | None:
        result = probe(n)
        probes.append(result)
        print(f"    {n}: {'fits' if result['fits'] else 'does not fit'}", file=sys.stderr, flush=True)
        return result if result["fits"] else None

    best = fits(start)
    if best is None:
        return None, probes
    low, high = start, None
    while high is None:
        n = min(low * 2, limit)
        if n == low:
            return best, probes
        found = fits(n)
        if found is None:
            high = n
        else:
            low, best = n, found
    while high - low > 1:
        middle = (low + high) // 2
        found = fits(middle)
        if found is None:
            high = middle
        else:
            low, best = middle, found
    return best, probes


def searches(args: argparse.Namespace, config: str) -> dict[str, Any]:
    print(f"{config}:", file=sys.stderr, flush=True)
    model, model_probes, tokens, token_probes = None, [], None, []
    if "model" in args.searches:
        print("  model (layers)", file=sys.stderr, flush=True)
        model, model_probes = search(lambda n: run_probe(args, config, n, args.batch), 1, args.max_layers)
    if "tokens" in args.searches:
        print("  tokens (batch)", file=sys.stderr, flush=True)
        tokens, token_probes = search(lambda n: run_probe(args, config, args.layers, n), 1, args.max_batch)
    return {"config": config, "largest_model": model, "most_tokens": tokens,
            "probes": {"model": model_probes, "tokens": token_probes}}


def _cell(found: dict[str, Any] | None, key: str, searched: bool) -> list[str]:
    if not searched:
        return ["not searched", "-", "-"]
    if found is None:
        return ["none fits", "-", "-"]
    amount = f"{found['parameters'] / 1e6:.1f}M ({found['layers']} layers)" if key == "model" else \
        f"{found['tokens_per_step']:,} ({found['batch']} x {found['seq']})"
    steps = ", ".join(f"{s * 1e3:.0f}" for s in found.get("step_s", []))
    return [amount, f"{found.get('tokens_per_s', 0):,.0f}", steps]


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    rows = [f"Device: {args.device}" + (f" (stowage's CPU mode, {args.capacity})" if args.device == "cpu" else "")
            + f"; Llama-style decoder hidden {args.hidden}, {args.heads}/{args.kv_heads} heads, vocab {args.vocab}; "
            f"model search at batch {args.batch} x {args.seq}, token search at {args.layers} layers; "
            f"{args.steps} steps a point, tokens/s the median after the first two.", "",
            "| configuration | largest model | tokens/s | step times (ms) | most tokens a step | tokens/s | "
            "step times (ms) | points probed |", "|---|---|---|---|---|---|---|---|"]
    for result in results:
        probed = len(result["probes"]["model"]) + len(result["probes"]["tokens"])
        cells = (_cell(result["largest_model"], "model", "model" in args.searches)
                 + _cell(result["most_tokens"], "tokens", "tokens" in args.searches))
        rows.append(f"| {result['config']} | " + " | ".join(cells) + f" | {probed} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--capacity", default="160MiB")
    parser.add_argument("--configs", nargs="+", help="default: every configuration the device has")
    parser.add_argument("--searches", nargs="+", choices=("model", "tokens"), default=("model", "tokens"))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4, help="the model search's batch")
    parser.add_argument("--layers", type=int, default=4, help="the token search's model")
    parser.add_argument("--max-layers", type=int, default=256)
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--probe-timeout", type=int, default=600)
    parser.add_argument("--json", help="write every probe and answer here")
    args = parser.parse_args()
    configs = args.configs or (CPU_CONFIGS if args.device == "cpu" else GPU_CONFIGS)
    results = [searches(args, config) for config in configs]
    table = markdown(results, args)
    print(table)
    if args.json:
        record = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "cpus": _cpus(),
                  "arguments": vars(args), "results": results, "table": table}
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
