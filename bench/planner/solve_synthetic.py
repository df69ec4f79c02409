"""stowage.plan.solve from Python on a synthetic lifetime trace of `--tensors` saved tensors: blocks
of 8 forward ops, each saving one tensor of 2 to 16 MiB that backward takes back in reverse
order, with 4 GiB besides them at every op. The budget is 4 GiB plus `--share` of the saved
bytes. Prints the best and the median of `--repeats` solves, and whether the plan fits.

    python3 bench/planner/solve_synthetic.py --tensors 10000 --share 0.6 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OTHER_BYTES = 4 << 30


def document(tensors: int, seed: int = 3) -> dict[str, Any]:
    random.seed(seed)
    ops = [{"name": "aten::mm", "module": f"blocks.{i // 8}", "phase": "forward",
            "duration_ms": 0.05 * random.uniform(0.5, 1.5), "other_bytes": OTHER_BYTES} for i in range(tensors)]
    ops += [{"name": "aten::mm", "module": "backward", "phase": "backward",
             "duration_ms": 0.1 * random.uniform(0.5, 1.5), "other_bytes": OTHER_BYTES} for _ in range(tensors)]
    saved = [{"module": f"blocks.{i // 8}", "bytes": random.choice([2, 4, 8, 16]) << 20, "created": i,
              "last_forward_use": min(i + 1, tensors - 1), "first_backward_use": 2 * tensors - 1 - i,
              "last_backward_use": 2 * tensors - 1 - i, "recompute_ms": 0.05, "recomputable": False,
              "offloadable": True, "recompute_inputs": [], "region": -1, "packs": [[f"blocks.{i // 8}", 0, i % 8]]}
             for i in range(tensors)]
    return {"format": "stowage-lifetimes", "version": 1, "ops": ops, "tensors": saved, "regions": [],
            "cost": {"to_host_bytes_per_ms": 2e7, "to_device_bytes_per_ms": 2e7, "prefetch_depth": 2},
            "unconstrained_peak_bytes": 0, "kept_saves": []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=10_000)
    parser.add_argument("--share", type=float, default=0.6)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import stowage.plan

    built = document(args.tensors)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        path.write_text(json.dumps(built))
        trace = stowage.plan.load_trace(str(path))
    budget = OTHER_BYTES + int(args.share * sum(t["bytes"] for t in built["tensors"]))
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        plan = stowage.plan.solve(trace, budget)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"tensors": args.tensors, "budget": budget, "best_s": min(seconds),
                      "median_s": statistics.median(seconds), "fits": bool(plan.fits)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
