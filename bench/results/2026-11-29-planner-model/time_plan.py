"""The planner's Python path, timed: profile a step (record + build the trace), the same step at a
grid of sizes (the structure check included), a saved trace read back, a solve, and a Plan made
and applied to one step. Median of 3 in one process; prints JSON."""
import json, statistics, sys, time, warnings
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "tests" / "python"))
import torch
import stowage, stowage.plan
stowage.enable(device="cpu", capacity="4GiB")
torch.set_num_threads(2)
from test_plan import COST, gpt_step, TinyGpt, lm_loss  # noqa
model, step = gpt_step()
model.train()
torch.manual_seed(0)
ids = {n: torch.randint(0, 512, (n, 128)) for n in (2, 3, 4)}
def step_at(batch):
    lm_loss(model(ids[batch]), ids[batch]).backward()
times = {k: [] for k in ("profile", "profile_grid", "load", "solve", "plan_step")}
for _ in range(3):
    t = time.perf_counter(); trace = stowage.plan.profile(step, cost=COST); times["profile"].append(time.perf_counter() - t)
    t = time.perf_counter(); sized = stowage.plan.profile(step_at, sizes={"batch": (2, 3)}, cost=COST); times["profile_grid"].append(time.perf_counter() - t)
    trace.save("/tmp/model/t.json")
    t = time.perf_counter(); again = stowage.plan.load_trace("/tmp/model/t.json"); times["load"].append(time.perf_counter() - t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter(); plan = stowage.plan.solve(again, again.unconstrained_peak_bytes // 2); times["solve"].append(time.perf_counter() - t)
        t = time.perf_counter()
        with plan:
            step()
        times["plan_step"].append(time.perf_counter() - t)
    model.zero_grad(set_to_none=True)
print(json.dumps({k: round(statistics.median(v), 4) for k, v in times.items()}))
