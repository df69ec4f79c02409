"""stowage.plan in CPU mode on the GPT-shaped transformer of tests/python/test_plan.py: profile one
step, then at fractions of its unconstrained peak solve, apply and measure. Prints, per budget and
per repeat, the predicted and measured peak (over what was allocated when the step began), the
step's wall time and whether the gradients are bitwise those of the unplanned step.

    python3 bench/planner/plan_budgets.py [--repeats 3]
"""

from __future__ import annotations

import argparse
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

    model, step = gpt_step()
    profile = stowage.plan.profile(step, cost=COST)
    reference_peak, reference_seconds, reference = measure(model, step)
    mib = 1 << 20
    print(f"unplanned: profiled peak {profile.unconstrained_peak_bytes / mib:.1f} MiB, measured "
          f"{reference_peak / mib:.1f} MiB, {reference_seconds * 1e3:.0f} ms")
    print("budget  repeat  predicted MiB  measured MiB  measured/budget  step ms  grads equal")
    for fraction in (0.7, 0.5, 0.3):
        budget = int(profile.unconstrained_peak_bytes * fraction)
        plan = stowage.plan.solve(profile, budget)
        for repeat in range(args.repeats):
            peak, seconds, grads = measure(model, step, plan)
            same = all(torch.equal(a, b) for a, b in zip(grads, reference))
            print(f"{fraction:>5.0%}  {repeat:>6}  {plan.predicted_peak_bytes / mib:>13.1f}  {peak / mib:>12.1f}  "
                  f"{peak / budget:>15.2f}  {seconds * 1e3:>7.0f}  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
