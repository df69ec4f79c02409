"""stowage.plan: keep, offload or recompute each saved tensor, chosen from one recorded step
under a memory budget (README, "Planning keep / offload / recompute").

    trace = stowage.plan.profile(step)            # runs step() once and records its lifetime trace
    plan = stowage.plan.solve(trace, budget="6GiB")
    with plan:
        step()                                    # recomputes and offloads as planned
    plan.save("plan.json"); plan = stowage.plan.load("plan.json")

Recomputation runs through torch's non-reentrant checkpoint on the model's blocks with stowage's
own selective contexts (Note [Selective recompute] in recompute_modes.py); offload through the
offload engine's offloader (stowage.offload).
"""

from stowage._core import Decision, LifetimeTrace
from stowage.plan.applying import Plan, RecomputeNotice, load, solve
from stowage.plan.recording import profile
from stowage.plan.sizes import SizedTrace, load_trace

__all__ = ["Decision", "LifetimeTrace", "Plan", "RecomputeNotice", "SizedTrace", "load", "load_trace", "profile", "solve"]
