"""Which decoder can I fully fine-tune on this device, and how fast? For a device budget (24 GiB,
the most common card, simulated on a larger one; or the whole device), the largest Qwen2.5-shaped
decoder (bench/e2e/decoder_ladder.py: the named shapes and depth rungs between them) each system
trains with AdamW, fp32 parameters, bf16 autocast, batch 2 x 2048, and its tokens a second:

  torch+checkpoint             stock PyTorch, every layer checkpointed, fused AdamW
  torchao-offload[+gradients]  torchao's CPUOffloadOptimizer, both ways of offload_gradients
  fsdp2-cpu-offload            FSDP2 on one GPU (world size 1) with CPUOffloadPolicy
  deepspeed-zero2-offload      DeepSpeed ZeRO-Offload (stage 2, the optimizer on the host)
  deepspeed-zero3-offload      DeepSpeed ZeRO-3 with the parameters offloaded too
  stowage-fit                  stowage.fit(budget=) under the allocator's limit: what fit chooses
  stowage-fit+parameters       fit asked to keep the parameters off the device (skipped, with the
                               reason, where this build has no stowage.offload.parameters)

    python3 bench/e2e/peers_at_budget.py --device cuda --budgets 24GiB device --budget-s 240 \
        --json OUT.json --markdown OUT.md
    python3 bench/e2e/peers_at_budget.py --device cpu --small --budgets 64MiB   # the dry run

Each point is a fresh process (peers_probe.py). A search per system would take minutes a point at
these sizes, so the points are chosen, then checked: each system's bytes a parameter on the
device and on the host (BYTES below, the designs' own figures) and the step's fixed bytes (the
logits of the whole vocabulary, the checkpointed layer inputs) predict the largest rung it trains
at the budget; that rung is tried first for every system, then, while --budget-s lasts, the
systems take turns a rung at a time: up from the largest that trained until one does not (the
bracket is closed), or down from a prediction that did not train until one does. The table says,
per system, the largest rung that trained, the smallest above it that did not and why (out of
memory, fit's refusal, or not tried in the time), every step's time, the setup's (for fit, its
decision), the device's peak and the host bytes a parameter measured; below it, fit's largest
over the best peer's, and fit's tokens/s at that peer's largest model over the peer's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from decoder_ladder import QWEN25, TINY, DecoderShape, ladder  # noqa: E402
from peers_probe import SYSTEM_NAMES, byte_size  # noqa: E402
from probe_runs import Clock, Point, host_available_bytes, run_point  # noqa: E402

HOST_SHARE = 0.85    # of the host memory available, what a prediction may plan for
MARGIN_SHARE, MARGIN_BYTES = 0.05, 16 << 20  # of the budget, what a prediction leaves free (fit's own margin)


@dataclass(frozen=True)
class Bytes:
    """A system's memory a parameter: on the device for the whole model, on the host, the number
    of decoder layers whose parameters (and their gradients, 8 B a parameter) the device holds at
    once where the parameters live on the host (0: all of them are on the device, counted in
    `device`), and whether bf16 autocast runs over fp32 parameters on the device: autocast keeps
    the bf16 copy of every parameter it casts until it exits, 2 B a parameter on a GPU (none on a
    CPU, where the dry run trains in fp32)."""
    device: float
    host: float
    layers_on_device: int = 0
    autocast_copies: bool = True


BYTES = {
    "torch+checkpoint": Bytes(16, 0),                # parameters, gradients, two moments
    "torchao-offload": Bytes(8, 16),                 # parameters and gradients; a pinned copy of both, moments
    "torchao-offload+gradients": Bytes(4, 16),       # gradients leave as backward makes them
    "fsdp2-cpu-offload": Bytes(0, 16, 2, False),     # bf16 compute by its MixedPrecisionPolicy; the root's
                                                     # embedding and head stay in
    "deepspeed-zero2-offload": Bytes(4, 16, 0, False),  # bf16 parameters and gradients; fp32 masters, grads, moments
    "deepspeed-zero3-offload": Bytes(0, 18, 2, False),  # bf16 parameters on the host too
    "stowage-fit": Bytes(8, 16),                     # parameters and gradients; masters, moments, a gradient buffer
    "stowage-fit+parameters": Bytes(0, 12, 2),       # the target: masters and moments
}
# The order points are tried in, by what the table is for: stowage's rows, then the peers that come
# nearest (torchao's, stock), then those that take longest (FSDP2's host AdamW, DeepSpeed's build)
VALUE_ORDER = ("stowage-fit", "stowage-fit+parameters", "torchao-offload+gradients", "torchao-offload",
               "torch+checkpoint", "fsdp2-cpu-offload", "deepspeed-zero2-offload", "deepspeed-zero3-offload")
SMALL = dict(batch=2, seq=128)
FULL = dict(batch=2, seq=2048)


def fixed_device_bytes(shape: DecoderShape, tokens: int) -> int:
    """What the step holds whatever the parameters: the logits of the whole vocabulary (bf16, their
    fp32 upcast and its gradient), each checkpointed layer's input, and one layer recomputed."""
    return 10 * tokens * shape.vocab + 4 * tokens * shape.hidden * shape.layers + 16 * tokens * shape.intermediate


def predicted_bytes(system: str, shape: DecoderShape, tokens: int, cpu_mode: bool) -> tuple[float, float]:
    """(device, host) bytes of `system` training `shape`. In CPU mode the host's bytes are on the
    simulated device too (every CPU tensor counts against it) but for stowage's, which keeps its
    offloaded bytes in host memory of its own."""
    model = BYTES[system]
    parameters = shape.parameters()
    device = model.device * parameters + fixed_device_bytes(shape, tokens)
    if model.autocast_copies and not cpu_mode:
        device += 2 * parameters
    if model.layers_on_device:
        embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)
        device += 8 * (model.layers_on_device * shape.block_parameters() + embeddings)
    host = model.host * parameters
    if cpu_mode and not system.startswith("stowage"):
        device, host = device + host, 0.0
    return device, host


def predict(system: str, rungs: list[DecoderShape], budget: int, host: int, tokens: int, cpu_mode: bool) -> int:
    """The index of the largest rung whose predicted bytes fit the budget and the host (0 where
    none does: the smallest is tried)."""
    best = 0
    usable = budget - max(MARGIN_SHARE * budget, MARGIN_BYTES)
    for index, shape in enumerate(rungs):
        device, host_bytes = predicted_bytes(system, shape, tokens, cpu_mode)
        if device <= usable and host_bytes <= HOST_SHARE * host:
            best = index
    return best


def device_total_bytes(device: str, budgets: list[str]) -> int | None:
    """The GPU's memory from nvidia-smi (the parent never starts CUDA: its context would hold memory
    the children need); None in CPU mode."""
    if device == "cpu":
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=30)
    return int(done.stdout.split()[0]) << 20


class DeepSpeedAdam:
    """DeepSpeed's CPU Adam is built by ninja with the machine's compiler the first time it loads:
    built once, when the first DeepSpeed point comes up, in a fresh TORCH_EXTENSIONS_DIR under
    --deepspeed-build-s, so that no point spends its time on it or waits on a half-built
    extension's lock. Its outcome goes into the run's result."""

    def __init__(self, args: argparse.Namespace, clock: Clock, result: dict[str, Any]) -> None:
        self.args, self.clock, self.result = args, clock, result
        self.why: str | None = None
        self.built = False

    def unavailable(self, system: str) -> str | None:
        """Why `system` cannot run (None: it can): only DeepSpeed's rows on a GPU depend on the build."""
        if not system.startswith("deepspeed") or self.args.device != "cuda":
            return None
        if not self.built:
            self.built = True
            os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="peers-torch-extensions-")
            code = ("import json, time; started = time.monotonic(); from deepspeed.ops.op_builder import "
                    "CPUAdamBuilder; CPUAdamBuilder().load(); "
                    "print(json.dumps({'fits': True, 'built_s': round(time.monotonic() - started, 1)}))")
            outcome = run_point([sys.executable, "-c", code], self.clock, {"what": "DeepSpeed's CPU Adam, JIT-built"},
                                limit_s=self.args.deepspeed_build_s)
            self.result["deepspeed_cpu_adam"] = outcome
            if not outcome["fits"]:
                self.why = f"DeepSpeed's CPU Adam did not build: {outcome['why']}"
            print(f"DeepSpeed's CPU Adam: {self.why or 'built in ' + str(outcome.get('built_s')) + ' s'}", flush=True)
        return self.why


class Search:
    """The points of one budget: each system's predicted rung, then its bracket a rung at a time,
    the systems taking turns while the time lasts."""

    def __init__(self, args: argparse.Namespace, clock: Clock, rungs: list[DecoderShape], budget: str) -> None:
        self.args, self.clock, self.rungs, self.budget = args, clock, rungs, budget
        self.tried: dict[tuple[str, int], Point] = {}

    def budget_bytes(self) -> int:
        return self.args.device_total if self.budget == "device" else byte_size(self.budget)

    def points_of(self, system: str) -> list[Point]:
        return [point for (name, _), point in self.tried.items() if name == system]

    def try_rung(self, system: str, index: int) -> Point:
        if (system, index) in self.tried:
            return self.tried[(system, index)]
        shape = self.rungs[index]
        point: Point = {"system": system, "budget": self.budget, "rung": index, "model": shape.name,
                        "parameters": shape.parameters()}
        command = [sys.executable, str(HERE / "peers_probe.py"), "--system", system, "--device", self.args.device,
                   *shape.arguments(), "--batch", str(self.args.batch), "--seq", str(self.args.seq),
                   "--steps", str(self.args.steps)]
        if self.budget != "device":
            command += ["--budget", str(byte_size(self.budget))]
        result = run_point(command, self.clock, point, limit_s=self.args.probe_s)
        self.tried[(system, index)] = result
        print(describe(result), flush=True)
        return result

    def run(self, systems: list[str], unavailable: Callable[[str], str | None]) -> dict[str, Any]:
        """Every system's row; one that `unavailable` names a reason for is not run, its row saying why."""
        rows: dict[str, Any] = {}
        tokens = self.args.batch * self.args.seq
        host = host_available_bytes()
        predicted = {s: predict(s, self.rungs, self.budget_bytes(), host, tokens, self.args.device == "cpu")
                     for s in systems}
        for system in systems:  # first every system's predicted point: the table's rows, each verified once
            why = unavailable(system)
            if why:
                rows[system] = {"system": system, "budget": self.budget, "largest": None, "smallest_not": None,
                                "bounded_by": why}
            else:
                self.try_rung(system, predicted[system])
        searched = [s for s in systems if s not in rows]
        moved = True
        while moved:  # then the brackets, a rung a turn, until each is closed or the time is spent
            moved = False
            for system in searched:
                index = next_rung(self.points_of(system), len(self.rungs))
                if index is not None:
                    self.try_rung(system, index)
                    moved = True
        for system in searched:
            rows[system] = row(system, self.budget, self.rungs[predicted[system]].name, self.points_of(system),
                               len(self.rungs))
        return {"budget": self.budget, "budget_bytes": self.budget_bytes(), "host_available_bytes": host,
                "rows": {s: rows[s] for s in systems}, "against_the_best_peer": self.against_the_best_peer(rows),
                "points": list(self.tried.values())}

    def against_the_best_peer(self, rows: dict[str, Any]) -> dict[str, Any]:
        """The issue's two questions: fit's largest model over the largest any peer trained, and fit's
        tokens/s at that peer's largest model over the peer's (fit tried there if it was not)."""
        peers = [r["largest"] for s, r in rows.items() if not s.startswith("stowage") and r["largest"]]
        fitted = [r["largest"] for s, r in rows.items() if s.startswith("stowage") and r["largest"]]
        if not peers or not fitted:
            return {"why": "no peer trained" if not peers else "no stowage row trained"}
        peer = max(peers, key=lambda p: (p["parameters"], p.get("tokens_per_s", 0)))
        fit = max(fitted, key=lambda p: p["parameters"])
        result: dict[str, Any] = {"peer": peer["system"], "peer_model": peer["model"], "fit_model": fit["model"],
                                  "largest_ratio": round(fit["parameters"] / peer["parameters"], 2)}
        if "stowage-fit" in rows and rows["stowage-fit"]["largest"]:
            at_peer = self.try_rung("stowage-fit", peer["rung"])
            if at_peer.get("fits") and peer.get("tokens_per_s"):
                result["tokens_per_s_ratio_at_peer_model"] = round(at_peer["tokens_per_s"] / peer["tokens_per_s"], 2)
            else:
                result["tokens_per_s_at_peer_model"] = at_peer.get("why", "did not train")
        return result


def next_rung(points: list[Point], rungs: int) -> int | None:
    """The rung a system tries next: the one above the largest that trained, or where none did, the
    one below the smallest that did not; None once the bracket is closed (the rung above the
    largest that trained did not), at the ladder's ends, or after a point that was not run."""
    if not points or any(p["fits"] is None for p in points):
        return None
    fitted = [p["rung"] for p in points if p["fits"]]
    failed = {p["rung"] for p in points if p["fits"] is False}
    if fitted:
        above = max(fitted) + 1
        return None if above in failed or above >= rungs else above
    below = min(failed) - 1
    return below if below >= 0 else None


def row(system: str, budget: str, predicted: str, points: list[Point], rungs: int) -> dict[str, Any]:
    """One system's answer: the largest rung that trained, the smallest above it that did not, and
    what bounded it."""
    fitted = [p for p in points if p["fits"]]
    best = max(fitted, key=lambda p: p["rung"]) if fitted else None
    above = [p for p in points if p["fits"] is not True and (best is None or p["rung"] > best["rung"])]
    smallest_not = min(above, key=lambda p: p["rung"]) if above else None
    entry: dict[str, Any] = {"system": system, "budget": budget, "predicted": predicted, "largest": best,
                             "smallest_not": smallest_not}
    if best is None and points and all(p["fits"] is None for p in points):  # the system could not run here
        entry["bounded_by"] = points[0].get("why", "not run")
    elif smallest_not is not None:
        entry["bounded_by"] = f"{smallest_not['model']}: {smallest_not.get('why', 'failed')}"
    elif best is not None and best["rung"] == rungs - 1:
        entry["bounded_by"] = "the ladder's largest rung trained"
    else:
        entry["bounded_by"] = "nothing trained" if best is None else "not closed: the next rung was not tried"
    return entry


def describe(point: Point) -> str:
    head = f"{point['budget']:>8} {point['system']:<26} {point['model']:<18} ({point['parameters'] / 1e9:.3f}B): "
    if point.get("fits"):
        steps = ", ".join(f"{s * 1000:.0f}" for s in point.get("step_s", []))
        return (head + f"trains, {point.get('tokens_per_s', 0):,.0f} tokens/s, steps [{steps}] ms, device peak "
                f"{point.get('peak_reserved_bytes', 0) / 2**30:.2f} GiB, host "
                f"{point.get('host_bytes_per_parameter', 0):.1f} B/param, setup {point.get('setup_s', 0)} s, "
                f"{point.get('wall_s', 0)} s in all")
    if point["fits"] is None:  # its reason says why it was not run or not finished
        return head + point.get("why", "not run")
    return head + f"does not train: {point.get('why', '')}"


def markdown(result: dict[str, Any]) -> str:
    lines = ["| budget | system | largest trained | parameters | tokens/s | steps (ms) | setup (s) | device peak | "
             "host B/param | smallest not trained: why |", "|---|---|---|---|---|---|---|---|---|---|"]
    for search in result["searches"]:
        for entry in search["rows"].values():
            best = entry["largest"]
            if best:
                steps = ", ".join(f"{s * 1000:.0f}" for s in best.get("step_s", []))
                figures = (f"{best['model']} | {best['parameters'] / 1e9:.3f}B | {best.get('tokens_per_s', 0):,.0f} | "
                           f"{steps} | {best.get('setup_s', 0)} | {best.get('peak_reserved_bytes', 0) / 2**30:.2f} GiB | "
                           f"{best.get('host_bytes_per_parameter', 0):.1f}")
            else:
                figures = "none | | | | | | "
            lines.append(f"| {entry['budget']} | {entry['system']} | {figures} | {entry['bounded_by'][:160]} |")
    for search in result["searches"]:
        versus = search["against_the_best_peer"]
        if "peer" not in versus:
            lines.append(f"\n{search['budget']}: no comparison: {versus['why']}")
            continue
        speed = (f"{versus['tokens_per_s_ratio_at_peer_model']:.2f}x its tokens/s at {versus['peer_model']}"
                 if "tokens_per_s_ratio_at_peer_model" in versus
                 else f"at {versus['peer_model']}: {versus.get('tokens_per_s_at_peer_model', 'not compared')}")
        lines.append(f"\n{search['budget']}: stowage's largest, {versus['fit_model']}, is {versus['largest_ratio']:.2f}x "
                     f"the parameters of the best peer's ({versus['peer']}, {versus['peer_model']}); {speed}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--budgets", nargs="+", default=["24GiB"], help="device caps (24GiB, bytes) or 'device'")
    parser.add_argument("--systems", nargs="+", choices=SYSTEM_NAMES, default=list(VALUE_ORDER),
                        help="tried in this order")
    parser.add_argument("--small", action="store_true", help="the dry run's tiny shapes, batch 2 x 128")
    parser.add_argument("--rungs", nargs="+", help="only these rungs of the ladder (names as the table gives them)")
    parser.add_argument("--steps", type=int, default=3, help="steps a point (the first is not in tokens/s)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="the whole run's time")
    parser.add_argument("--probe-s", type=float, default=150.0, help="one point's time at most")
    parser.add_argument("--deepspeed-build-s", type=float, default=120.0,
                        help="the time DeepSpeed's CPU Adam may take to build (once, before its points)")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    if args.device == "cpu" and "device" in args.budgets:
        parser.error("CPU mode has no device to fill: give its budget in bytes (the simulated device's size)")
    args.batch, args.seq = (SMALL if args.small else FULL).values()
    args.device_total = device_total_bytes(args.device, args.budgets)
    clock = Clock(args.budget_s)
    rungs = ladder(TINY if args.small else QWEN25)
    if args.rungs:
        unknown = sorted(set(args.rungs) - {r.name for r in rungs})
        if unknown:
            parser.error(f"--rungs: {unknown} are not on the ladder; it has {[r.name for r in rungs]}")
        rungs = [r for r in rungs if r.name in args.rungs]
    result: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              "machine": platform.node(), "command": " ".join(sys.argv), "device": args.device,
                              "batch": args.batch, "seq": args.seq, "device_total_bytes": args.device_total,
                              "searches": []}
    deepspeed = DeepSpeedAdam(args, clock, result)
    for budget in args.budgets:
        result["searches"].append(Search(args, clock, rungs, budget).run(args.systems, deepspeed.unavailable))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    table = markdown(result)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
