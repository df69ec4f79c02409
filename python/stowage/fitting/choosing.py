"""`fit`'s choice: the share of optimizer states kept on the device, and the plan for the step's
activations under what that share leaves, taken together as the fastest predicted step that fits.

For each share of states kept on the device (all of them, torch's optimizer unchanged; then less,
down to none: stowage.offload.AdamW with that ``device_fraction``) the planner solves the step
under the memory the share leaves. A share is feasible when a plan fits and the optimizer's own
step fits beside the gradients, and the host holds the offloaded states. Its predicted time is the plan's step plus the update of the
states kept on the device, the host update of the rest (measured rates, stowage.fitting
.update_rates; in the default "exact" mode the host update is not hidden behind backward) and
the rest's parameters crossing back. Predictions within 3% of the fastest count as a tie, won by
the most states on the device (the least changed). More
states on the device leave less room for activations (more recompute and offload); fewer add host
time: the choice weighs the two on this model rather than by a fixed rule.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from stowage._core import format_bytes
from stowage.fitting.accounting import DeviceMemory, HostMemory
from stowage.fitting.update_rates import UpdateRates
from stowage.plan import LifetimeProfile, Plan, solve

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
    host_bytes: int = 0     # host memory the offloaded states and the plan's paged activations take

    @property
    def feasible(self) -> bool:
        return not self.reason

    @property
    def step_ms(self) -> float:
        assert self.plan is not None
        return self.plan.predicted_step_ms + self.update_ms


def _option(profile: LifetimeProfile, memory: DeviceMemory, host: HostMemory, rates: UpdateRates, fraction: float,
            foreach: bool) -> Option:
    budget = memory.activation_budget(fraction)
    host_bytes = host.states(memory, fraction)
    peak = memory.optimizer_step_peak(fraction, foreach=foreach and fraction == 1.0)
    count = memory.parameter_count
    write_back_ms = (1 - fraction) * memory.gradients / float(profile.cost["to_device_bytes_per_ms"])
    update_ms = count * (fraction * rates.device_ms_per_parameter + (1 - fraction) * rates.host_ms_per_parameter)
    update_ms += write_back_ms  # the updated parameters cross back after the update
    if host_bytes > host.available:
        return Option(fraction, budget, None, peak, update_ms,
                      f"the host cannot hold the offloaded states: {format_bytes(host_bytes)} needed, "
                      f"{format_bytes(host.available)} available ({host.limited_by})", host_bytes)
    if budget <= 0:
        return Option(fraction, budget, None, peak, update_ms, "the states alone fill the device", host_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a plan that does not fit is reported as an option's reason
        plan = solve(profile, budget)
    if not plan.fits:
        return Option(fraction, budget, plan, peak, update_ms,
                      f"no plan fits: the lowest step peak found is {format_bytes(plan.predicted_peak_bytes)}",
                      host_bytes)
    host_bytes += paged_bytes(plan)
    if host_bytes > host.available:
        return Option(fraction, budget, plan, peak, update_ms,
                      f"the host cannot hold the offloaded states and paged activations: {format_bytes(host_bytes)} "
                      f"needed, {format_bytes(host.available)} available ({host.limited_by})", host_bytes)
    if peak > memory.usable:
        return Option(fraction, budget, plan, peak, update_ms, "the optimizer's step does not fit", host_bytes)
    return Option(fraction, budget, plan, peak, update_ms, "", host_bytes)


def paged_bytes(plan: Plan) -> int:
    """Pinned host bytes the plan's offloaded activations take: every offloaded tensor's (they are
    all on the host at once between forward and backward, where the step turns)."""
    return sum(t.bytes for t, d in zip(plan.profile.tensors, plan.decisions) if d == "offload")


def pick(step_ms: dict[float, float]) -> float | None:
    """The share to take, from the feasible shares' predicted step times: the fastest, where
    predictions within TIE of it are not told apart and the most states on the device wins."""
    if not step_ms:
        return None
    fastest = min(step_ms.values())
    return max(fraction for fraction, ms in step_ms.items() if ms <= fastest * (1 + TIE))


def agree(per_rank: list[dict[float, float]]) -> float | None:
    """One share for ranks that train in step, from each rank's feasible shares and predicted
    times: a share feasible on every rank, timed by its slowest rank (the step waits for it)."""
    common = set.intersection(*(set(times) for times in per_rank)) if per_rank else set()
    return pick({fraction: max(times[fraction] for times in per_rank) for fraction in common})


def feasible_times(options: list[Option]) -> dict[float, float]:
    return {o.fraction: o.step_ms for o in options if o.feasible}


def weigh(profile: LifetimeProfile, memory: DeviceMemory, host: HostMemory, rates: UpdateRates, *,
          can_offload: bool, foreach: bool) -> list[Option]:
    """Every share weighed (all of them on the device only, when states cannot move); `pick`, or
    `agree` across ranks, takes one. A share whose offloaded states the host cannot hold is not
    feasible, whatever the device."""
    fractions = FRACTIONS if can_offload else (1.0,)
    return [_option(profile, memory, host, rates, f, foreach) for f in _distinct(fractions, memory)]


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
