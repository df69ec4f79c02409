"""stowage.plan: keep, offload or recompute each saved tensor, chosen from one recorded step
under a memory budget.

    import stowage.plan

    trace = stowage.plan.profile(step)            # runs step() once and records its lifetime trace
    plan = stowage.plan.solve(trace, budget="6GiB")
    print(plan)                                   # decisions by module, predicted peak and time
    with plan:
        step()                                    # recomputes and offloads as planned
    plan.save("plan.json"); plan = stowage.plan.load("plan.json")

A model that does not fit at the size it trains at is recorded at sizes that do, and planned for
the size it trains at (byte counts and times are polynomials in the sizes, stowage.plan.sizes):

    trace = stowage.plan.profile(step_at, sizes={"batch": (2, 4), "seq": (128, 256, 384)})
    plan = stowage.plan.solve(trace, budget="6GiB", at={"batch": 8, "seq": 4096})

Recomputation runs through torch's non-reentrant checkpoint on the model's blocks (the items of
its ``nn.ModuleList`` / ``nn.Sequential``) with stowage's own selective contexts (Note [Selective
recompute] in recompute_modes.py): per op, keep or recompute; state a block's forward writes
(BatchNorm's statistics) is written once, and a block can be recomputed in each of several
backwards (``retain_graph=True``). The Python a recomputed block's forward runs (forward hooks of
its modules, counters, prints) runs twice a step, as under torch's checkpoint; the first ``with
plan:`` that recomputes says so once (a RecomputeNotice, a UserWarning). Offload runs
through the offload engine's offloader (``stowage.offload``). A checkpoint keeps what it saves out
of reach of the offloader, so the planner offers only what the runtime can apply: in a block it
recomputes, a tensor is kept or recomputed, and the block's inputs are kept or offloaded; in a
block it does not, each tensor is kept or offloaded. A plan that does not match the step it runs
on (other modules, other ops) keeps what it cannot place and says so once.

A model compiled as a whole (``torch.compile(model)``) hides its saved tensors from both
mechanisms until its forward ends: ``with plan:`` refuses it; compile each block instead, after
profiling.
"""

from stowage.plan.applying import Plan, RecomputeNotice, load, solve
from stowage.plan.lifetimes import LifetimeTrace
from stowage.plan.recording import profile
from stowage.plan.sizes import SizedTrace, load_trace

__all__ = ["LifetimeTrace", "Plan", "RecomputeNotice", "SizedTrace", "load", "load_trace", "profile", "solve"]
