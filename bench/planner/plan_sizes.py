"""stowage.plan at several sizes in CPU mode: the GPT-shaped transformer of tests/python/test_plan.py
recorded at a grid of small batches and sequence lengths, evaluated at larger sizes, and compared
with a step recorded directly at each: saved tensors' bytes, the unconstrained peak, the step's
summed op time, and the peak of a plan solved from the grid when run (simulated) on the direct
recording.

    python3 bench/planner/plan_sizes.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

TARGETS = ((4, 128), (8, 256), (16, 256))


def main() -> int:
    import stowage

    stowage.enable(device="cpu", capacity="4GiB")
    from test_plan import COST
    from test_plan_sizes import GRID, gpt_at

    import stowage.plan

    step = gpt_at()
    began = time.perf_counter()
    sized = stowage.plan.profile(step, sizes=GRID, cost=COST)
    print(f"grid {GRID}: {len(sized.traces)} steps recorded in {time.perf_counter() - began:.1f} s")
    mib = 1 << 20
    print(f"{'batch x seq':>12} {'tensors equal':>14} {'peak MiB direct/grid':>22} {'ops ms direct/grid':>20} "
          f"{'50% plan on direct MiB (budget)':>32}")
    for batch, seq in TARGETS:
        step(batch, seq)
        direct = stowage.plan.profile(lambda: step(batch, seq), cost=COST)
        at = {"batch": batch, "seq": seq}
        predicted = sized.at(at)
        equal = sum(a.bytes == b.bytes for a, b in zip(predicted.tensors, direct.tensors))
        budget = direct.unconstrained_peak_bytes // 2
        plan = stowage.plan.solve(sized, budget, at=at)
        on_direct = stowage.plan.Plan(direct, plan.decisions, budget).predicted_peak_bytes
        print(f"{batch:>5} x {seq:<5} {equal:>6}/{len(direct.tensors):<7} "
              f"{direct.unconstrained_peak_bytes / mib:>10.1f}/{predicted.unconstrained_peak_bytes / mib:<10.1f} "
              f"{sum(o.duration_ms for o in direct.ops):>9.0f}/{sum(o.duration_ms for o in predicted.ops):<9.0f} "
              f"{on_direct / mib:>17.1f} ({budget / mib:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
