"""What seeing writes through aliases to saved activations costs a training step (Note [Saved
tensors written through an alias] in python/tensors/saved_storage.hpp; Note [Selective
recompute] in stowage/plan/recompute_modes.py): each watch on and patched out, interleaved in one
process, every step's time reported.

    python3 bench/e2e/alias_watch_cost.py [--device cpu|cuda] [--steps 12] [--json OUT]

Two steps of bench/e2e/gpt2_model.py's GPT-2 at a small width, each with its watch on and off:
- "offload": every saved activation offloaded (stowage.offload.activations(min_bytes=0)); the
  watch is the sweep as the region ends that keeps what is still referenced (reading a storage
  still alive in place is no watch: it only skips copies);
- "recompute": a plan recomputing every block (selective checkpointing) and offloading what is
  saved outside them; the watch is the checksums of what each block's forward read and made
  (RecomputeWatch), taken as its forward ends and again before its replay.
Off, the watch's function is replaced for the step by one that does nothing (bench only); on, by
one that calls it and adds up its time, which is reported beside the steps' (a step's time on a
shared machine varies more than the watch takes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12, help="measured steps per setting")
    parser.add_argument("--json", type=str, default=None)
    return parser.parse_args()


@contextlib.contextmanager
def patched_out(owner: Any, name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def recompute_plan(model: Any, step: Callable[[], None]) -> Any:
    import stowage.plan

    trace = stowage.plan.profile(step, model=model)
    keep, offload, recompute = stowage.plan.Decision.keep, stowage.plan.Decision.offload, stowage.plan.Decision.recompute
    decisions = [recompute if t.recomputable else offload if t.offloadable else keep for t in trace.tensors]
    plan = stowage.plan.Plan(trace, decisions, trace.unconstrained_peak_bytes)
    plan.model = model
    return plan


def main() -> None:
    args = parse()
    import torch

    import stowage
    from gpt2_model import seeded_model_and_tokens
    from stowage.offload import activation_offload
    from stowage.plan import recompute_modes

    if args.device == "cuda":
        stowage.enable(device="cuda")
    else:
        stowage.enable(device="cpu", capacity="8GiB")
    model, ids = seeded_model_and_tokens(args.layers, args.width, args.batch, args.seq, args.device)

    def plain_step() -> None:
        model(ids, ids).backward()
        model.zero_grad(set_to_none=True)

    plan = recompute_plan(model, plain_step)
    stowage.mark_step()
    regions: dict[str, Callable[[], Any]] = {
        "offload": lambda: stowage.offload.activations(min_bytes=0),
        "recompute": lambda: plan,
    }
    watches = {"offload": [(activation_offload.SavedTensorOffload, "__exit__", _exit_without_sweep)],
               "recompute": [(recompute_modes.ForwardMode, "_watch", lambda self: None),
                             (recompute_modes.RecomputeWatch, "check", lambda self, where: None)]}
    spent = [0.0]

    def timed(function: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                spent[0] += time.perf_counter() - start
        return run

    def step(kind: str, watched: bool) -> tuple[float, float]:
        spent[0] = 0.0
        start = time.perf_counter()
        with contextlib.ExitStack() as patches:
            for owner, name, replacement in watches[kind]:
                patches.enter_context(patched_out(owner, name, timed(getattr(owner, name)) if watched else replacement))
            with regions[kind]():
                loss = model(ids, ids)
                if kind == "recompute":
                    loss.backward()
            if kind == "offload":
                loss.backward()
        model.zero_grad(set_to_none=True)
        stowage.mark_step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3, spent[0] * 1e3

    result: dict[str, Any] = {"date": str(date.today()), "machine": platform.node(), "device": args.device,
                              "command": " ".join(sys.argv), "parameters": sum(p.numel() for p in model.parameters())}
    for kind in regions:
        for _ in range(2):
            step(kind, True)  # warm-up: pinned pool, caches
        times: dict[str, list[float]] = {"off": [], "on": []}
        watch_ms: list[float] = []
        for index in range(2 * args.steps):
            setting = "on" if index % 2 else "off"
            took, watching = step(kind, setting == "on")
            times[setting].append(took)
            if setting == "on":
                watch_ms.append(watching)
        medians = {k: statistics.median(v) for k, v in times.items()}
        watch = statistics.median(watch_ms)
        result[kind] = {"step_ms": times, "median_ms": medians, "cost": medians["on"] / medians["off"] - 1,
                        "watch_ms": watch_ms, "watch_share": watch / medians["on"]}
        print(f"{kind}: watch off {medians['off']:.1f} ms, on {medians['on']:.1f} ms a step: "
              f"{100 * result[kind]['cost']:+.1f}%; the watch itself {watch:.2f} ms a step "
              f"({100 * watch / medians['on']:.2f}% of it) (every step: off {[round(t) for t in times['off']]}, "
              f"on {[round(t) for t in times['on']]})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def _exit_without_sweep(self: Any, kind: Any, error: Any, traceback: Any) -> None:
    """SavedTensorOffload.__exit__ but for the sweep as the region ends (region_ended)."""
    if self._hooks is not None:
        self._hooks.__exit__(kind, error, traceback)
        self._hooks = None


if __name__ == "__main__":
    main()
