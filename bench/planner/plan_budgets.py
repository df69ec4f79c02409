"""stowage.plan in CPU mode on the GPT-shaped transformer of tests/python/test_plan.py: profile one
step, then at fractions of its unconstrained peak solve, apply and measure. Prints, per budget and
per repeat, the predicted and measured peak (over what was allocated when the step began), the
step's wall time and whether the gradients are bitwise those of the unplanned step; and the same
for the comparison points applied as plans: full activation checkpointing (every block
recomputed) and offload everything.

    python3 bench/planner/plan_budgets.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))


def measure(model: Any, step: Callable[[], None], plan: Any = None) -> tuple[int, float, list[Any]]:
    import stowage

    model.zero_grad(set_to_none=True)
    stowage.mark_step()
    start = stowage.memory_allocated("cpu")
    stowage.reset_peak_stats("cpu")
    began = time.perf_counter()
    if plan is None:
        step()
    else:
        with plan:
            step()
    seconds = time.perf_counter() - began
    peak = stowage.max_memory_allocated("cpu") - start
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    stowage.mark_step()
    return peak, seconds, grads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import stowage

    stowage.enable(device="cpu", capacity="4GiB")
    import torch
    from test_plan import COST, gpt_step

    import stowage.plan
    from stowage import _core
    from stowage.plan import Plan

    model, step = gpt_step()
    profile = stowage.plan.profile(step, cost=COST)
    reference_peak, reference_seconds, reference = measure(model, step)
    mib = 1 << 20
    print(f"unplanned: profiled peak {profile.unconstrained_peak_bytes / mib:.1f} MiB, measured "
          f"{reference_peak / mib:.1f} MiB, {reference_seconds * 1e3:.0f} ms")
    print("plan                repeat  predicted MiB  measured MiB  measured/budget  step ms  grads equal")
    whole = profile.unconstrained_peak_bytes
    points = [(f"{r.name} ", Plan(profile, r.decisions, whole)) for r in _core.reference_plans(profile)
              if r.name != "no change"]
    points += [(f"budget {fraction:.0%}", stowage.plan.solve(profile, int(whole * fraction)))
               for fraction in (0.7, 0.5, 0.3)]
    runs: dict[str, list[tuple[int, float]]] = {}
    for name, plan in points:
        for repeat in range(args.repeats):
            peak, seconds, grads = measure(model, step, plan)
            same = all(torch.equal(a, b) for a, b in zip(grads, reference))
            runs.setdefault(name, []).append((peak, seconds))
            print(f"{name:<18}  {repeat:>6}  {plan.predicted_peak_bytes / mib:>13.1f}  {peak / mib:>12.1f}  "
                  f"{peak / plan.budget:>15.2f}  {seconds * 1e3:>7.0f}  {same}")
    summarize(runs, {name: plan.budget for name, plan in points})
    return 0


def summarize(runs: dict[str, list[tuple[int, float]]], budgets: dict[str, int]) -> None:
    """Per budget: the plan's largest measured peak and median step time, beside full
    checkpointing's and offload everything's where their largest measured peak fits the budget."""
    mib = 1 << 20

    def cell(name: str, budget: int) -> str:
        peaks, times = [p for p, _ in runs[name]], [t for _, t in runs[name]]
        if max(peaks) > budget:
            return f"does not fit ({max(peaks) / mib:.1f} MiB)"
        return f"{max(peaks) / mib:.1f} MiB, {statistics.median(times) * 1e3:.0f} ms"

    print("\nbudget      plan (max peak, median step)   full checkpointing          offload everything")
    for name, budget in budgets.items():
        if name.startswith("budget"):
            print(f"{budget / mib:>6.1f} MiB  {cell(name, budget):<29}  {cell('full checkpointing ', budget):<26}  "
                  f"{cell('offload everything ', budget)}")


if __name__ == "__main__":
    raise SystemExit(main())
