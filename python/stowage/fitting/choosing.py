"""`fit`'s choice: the share of optimizer states kept on the device, the micro-batches the global
batch runs as, and the plan for the step's activations under what those leave, taken together as
the fastest predicted step that fits.

For each share of states kept on the device (all of them, torch's optimizer unchanged; then less,
down to none: stowage.offload.AdamW with that ``device_fraction``) and each micro-batch size (the
whole batch; with ``micro_batches="auto"`` cuts into 2, 4, 8 ... micro-batches,
stowage.fitting.micro_batches) the planner solves one micro-batch's step under the memory the
share leaves; past the first micro-batch the gradients are on the device from the step's start,
so a cut step's plan has the gradients' bytes less. A choice is feasible when a plan fits, the
optimizer's own step fits beside the gradients, and the host holds the offloaded states. Its
predicted time is the micro-batches' planned steps plus the update of the states kept on the
device, the host update of the rest (measured rates, stowage.fitting.update_rates; in the default
"exact" mode the host update is not hidden behind backward) and the rest's parameters crossing
back. Predictions within 3% of the fastest count as a tie, won by the fewest micro-batches, then
the most states on the device (the least changed). More states on the device or larger
micro-batches leave less room for activations (more recompute and offload); fewer add host time
or steps: the choice weighs them on this model rather than by a fixed rule.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

from stowage import _core
from stowage._core import format_bytes
from stowage.fitting.accounting import DeviceMemory, HostMemory
from stowage.fitting.update_rates import UpdateRates
from stowage.plan import LifetimeTrace, Plan, solve

FRACTIONS = (1.0, 0.75, 0.5, 0.25, 0.0)
TIE = 0.03


@dataclass(frozen=True)
class Option:
    """One share of states on the device and what it leads to."""

    fraction: float
    activation_budget: int
    plan: Plan | None       # None where no plan fits
    optimizer_peak: int     # device bytes during the optimizer's step
    update_ms: float        # the optimizer's update: device share and host share
    reason: str             # why it does not fit, or ""
    host_bytes: int = 0     # host memory the offloaded states and the plan's offloaded activations take
    micro_rows: int = 0     # rows of one micro-batch (the plan's), the example's rows when not cut
    micro_batches: int = 1  # micro-batches the example runs as

    @property
    def feasible(self) -> bool:
        return not self.reason

    @property
    def key(self) -> Choice:
        return (self.fraction, self.micro_rows)

    @property
    def keeps_everything(self) -> bool:
        """Whether the plan neither recomputes nor offloads (a smaller micro-batch only adds steps)."""
        return self.plan is not None and all(d == "keep" for d in self.plan.decisions)

    @property
    def step_ms(self) -> float:
        assert self.plan is not None
        return self.micro_batches * self.plan.predicted_step_ms + self.update_ms


Choice = tuple[float, int]  # (share of states on the device, rows of a micro-batch)


def _option(trace: LifetimeTrace, memory: DeviceMemory, host: HostMemory, rates: UpdateRates, fraction: float,
            foreach: bool, micro_rows: int, micro_batches: int, reserve: int = 0) -> Option:
    budget = memory.activation_budget(fraction) - reserve
    if micro_batches > 1:  # the gradients are there from the second micro-batch's start
        budget -= memory.gradients
    cut = {"micro_rows": micro_rows, "micro_batches": micro_batches}
    host_bytes = host.states(memory, fraction)
    peak = memory.optimizer_step_peak(fraction, foreach=foreach and fraction == 1.0)
    count = memory.parameter_count
    write_back_ms = (1 - fraction) * memory.gradients / float(trace.cost["to_device_bytes_per_ms"])
    update_ms = count * (fraction * rates.device_ms_per_parameter + (1 - fraction) * rates.host_ms_per_parameter)
    update_ms += write_back_ms  # the updated parameters cross back after the update
    if host_bytes > host.available:
        return Option(fraction, budget, None, peak, update_ms,
                      f"the host cannot hold the offloaded states: {format_bytes(host_bytes)} needed, "
                      f"{format_bytes(host.available)} available ({host.limited_by})", host_bytes, **cut)
    if budget <= 0:
        return Option(fraction, budget, None, peak, update_ms, "the states alone fill the device", host_bytes, **cut)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a plan that does not fit is reported as an option's reason
        plan = solve(trace, budget)
    if not plan.fits:
        return Option(fraction, budget, plan, peak, update_ms,
                      f"no plan fits: the lowest step peak found is {format_bytes(plan.predicted_peak_bytes)}",
                      host_bytes, **cut)
    host_bytes += offloaded_bytes(plan)
    if host_bytes > host.available:
        return Option(fraction, budget, plan, peak, update_ms,
                      f"the host cannot hold the offloaded states and activations: {format_bytes(host_bytes)} "
                      f"needed, {format_bytes(host.available)} available ({host.limited_by})", host_bytes, **cut)
    if peak > memory.usable:
        return Option(fraction, budget, plan, peak, update_ms, "the optimizer's step does not fit", host_bytes, **cut)
    return Option(fraction, budget, plan, peak, update_ms, "", host_bytes, **cut)


def offloaded_bytes(plan: Plan) -> int:
    """Pinned host bytes the plan's offloaded activations take: every offloaded tensor's (they are
    all on the host at once between forward and backward, where the step turns)."""
    return sum(t.bytes for t, d in zip(plan.trace.tensors, plan.decisions) if d == "offload")


def pick(step_ms: dict[Choice, float]) -> Choice | None:
    """The choice to take, from the feasible choices' predicted step times (Note [Choosing a share]
    in planner/share_search.hpp: the fastest, within TIE the most rows, then the most states)."""
    return _core.pick_choice(step_ms, TIE)


def agree(per_rank: list[dict[Choice, float]]) -> Choice | None:
    """One choice for ranks that train in step: feasible on every rank, timed by its slowest."""
    return _core.agree_choice(per_rank, TIE)


def feasible_times(options: list[Option]) -> dict[Choice, float]:
    return {o.key: o.step_ms for o in options if o.feasible}


TraceAt = Callable[[int], LifetimeTrace]  # one micro-batch's lifetime trace, by its rows
EXTRA_CUTS = 3  # halvings weighed below the largest micro-batch that fits


def weigh(trace_at: TraceAt, memory: DeviceMemory, host: HostMemory, rates: UpdateRates, *, rows: int,
          micro_rows: int | None, smallest: int, can_offload: bool, foreach: bool, reserve: int = 0,
          micro_count: int | None = None) -> list[Option]:
    """Every share weighed (all of them on the device only, when states cannot move), each at the
    micro-batch size given (``micro_rows``) or, where fit may choose (None), at the largest that
    fits and up to EXTRA_CUTS halvings of it (Note [Choosing a share] in
    planner/share_search.hpp, which searches; each option is solved here). `pick`, or `agree`
    across ranks, takes one. A share whose offloaded states the host cannot hold is not
    feasible, whatever the device. ``reserve``: device bytes kept from every plan (what a tried
    step added beyond its plan, stowage.fitting.trial). ``micro_count``: the micro-batches a
    size asked for runs as (a count that does not divide the rows: more than their rows' share)."""
    solved: dict[Choice, Option] = {}
    asked = micro_rows

    def evaluate(fraction: float, micro_rows: int, micro_batches: int) -> tuple[bool, bool, float]:
        if micro_count is not None and micro_rows == asked:
            micro_batches = micro_count
        option = _option(trace_at(micro_rows), memory, host, rates, fraction, foreach, micro_rows, micro_batches,
                         reserve)
        solved[option.key] = option
        return option.feasible, option.keeps_everything, option.step_ms if option.feasible else 0.0

    fractions = _distinct(FRACTIONS if can_offload else (1.0,), memory)
    listed = _core.weigh_shares(fractions, rows, micro_rows, smallest, EXTRA_CUTS, evaluate)
    return [solved[choice] for choice in listed]


def _distinct(fractions: tuple[float, ...], memory: DeviceMemory) -> list[float]:
    """The shares that place states differently: a share is by whole parameters, so where a
    large first parameter does not fit in it, a share keeps what a smaller one keeps; of such
    shares only the smallest is weighed (the one that names what is kept)."""
    shares: dict[int, float] = {}
    for fraction in fractions:  # largest first; torch's own optimizer (1.0) is never replaced
        key = memory.states_on_device(fraction)
        if shares.get(key) != 1.0:
            shares[key] = fraction
    return sorted(shares.values(), reverse=True)
