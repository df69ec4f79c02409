"""`fit`'s choice: the share of optimizer states kept on the device, the micro-batches the global
batch runs as, and the plan for the step's activations under what those leave, taken together as
the fastest predicted step that fits.

For each share of states kept on the device (all of them, torch's optimizer unchanged; then less,
down to none: stowage.offload.AdamW with that ``device_fraction``) and each micro-batch size (the
whole batch; with ``micro_batches="auto"`` cuts into 2, 4, 8 ... micro-batches,
stowage.fitting.micro_batches) the planner solves one micro-batch's step under the memory the
share leaves, and works out whether the optimizer's step and the host's states fit and the
step's predicted time (measured rates, stowage.fitting.update_rates): one call, Note [Weighing
fit's options] in planner/fit_weighing.hpp. Predictions within 3% of the fastest count as a tie,
won by the fewest micro-batches, then the most states on the device (the least changed; Note
[Choosing a share] in planner/share_search.hpp). More states on the device or larger
micro-batches leave less room for activations (more recompute and offload); fewer add host time
or steps: the choice weighs them on this model rather than by a fixed rule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from stowage import _core
from stowage.fitting.trial import without_recompute
from stowage.offload.adam_buckets import kept_on_device
from stowage.plan import LifetimeTrace, Plan, SizedTrace
from stowage.plan.applying import with_cost

FRACTIONS = (1.0, 0.75, 0.5, 0.25, 0.0)
TIE = 0.03
EXTRA_CUTS = 3  # halvings weighed below the largest micro-batch that fits

Choice = tuple[float, int]  # (share of states on the device, rows of a micro-batch)
TraceAt = Callable[[int], LifetimeTrace]  # one micro-batch's lifetime trace, by its rows


@dataclass(frozen=True)
class StepTraces:
    """One micro-batch's lifetime trace by its rows: as records (`at`: the plan applied keeps
    them) and as the planner's (`native`, a _core.StepTraces: what is weighed). ``regions``: the
    step's checkpoint regions, alike at any rows."""

    at: TraceAt
    native: Any
    regions: list[Any]

    @staticmethod
    def whole(trace: LifetimeTrace) -> StepTraces:
        """A step recorded once, the same at any rows."""
        return StepTraces(lambda rows: trace, _core.StepTraces(trace, trace.cost), trace.regions)

    @staticmethod
    def by_rows(sized: SizedTrace, sizes: dict[str, int], rows_size: str = "batch") -> StepTraces:
        """A step recorded at a grid: at `sizes`, the rows in `rows_size`."""
        first = sized.traces[0]
        native = _core.StepTraces(sized.native, [sizes.get(name, 0) for name in sized.sizes],
                                  list(sized.sizes).index(rows_size), first.cost)
        return StepTraces(lambda rows: sized.at({**sizes, rows_size: rows}), native, first.regions)


class Option:
    """One weighed option (a _core.FitOption: share, micro-batch rows and count, activation budget,
    optimizer peak, host bytes, update and step times, the reason it does not fit or "") and its
    plan, made from its decisions where it was solved."""

    def __init__(self, weighed: Any, trace_at: TraceAt) -> None:
        self._weighed, self._trace_at = weighed, trace_at

    def __getattr__(self, name: str) -> Any:  # the weighed figures (not its own: a copy being made has none yet)
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._weighed, name)

    @property
    def key(self) -> Choice:
        return (self.fraction, self.micro_rows)

    @functools.cached_property
    def plan(self) -> Plan | None:
        """The option's plan (None where none was solved: the states alone fill a device or host)."""
        if not self._weighed.solved:
            return None
        trace = self._trace_at(self.micro_rows)
        cost = trace.cost
        cost = _core.CostModel(cost.to_host_bytes_per_ms, cost.to_device_bytes_per_ms, self._weighed.prefetch_depth)
        return Plan(with_cost(trace, cost), self._weighed.decisions, self.activation_budget)


def pick(step_ms: dict[Choice, float]) -> Choice | None:
    """The choice to take, from the feasible choices' predicted step times (Note [Choosing a share]
    in planner/share_search.hpp: the fastest, within TIE the most rows, then the most states)."""
    return _core.pick_choice(step_ms, TIE)


def agree(per_rank: list[dict[Choice, float]]) -> Choice | None:
    """One choice for ranks that train in step: feasible on every rank, timed by its slowest."""
    return _core.agree_choice(per_rank, TIE)


def feasible_times(options: list[Option]) -> dict[Choice, float]:
    return {o.key: o.step_ms for o in options if o.feasible}


def weigh(traces: StepTraces, memory: Any, host: Any, rates: Any, *, rows: int, micro_rows: int | None,
          smallest: int, can_offload: bool, foreach: bool, reserve: int = 0, micro_count: int | None = None,
          not_recomputed: frozenset[int] = frozenset()) -> list[Option]:
    """Every share weighed (all of them on the device only, when states cannot move), each at the
    micro-batch size given (``micro_rows``) or, where fit may choose (None), at the largest that
    fits and up to EXTRA_CUTS halvings of it (Note [Choosing a share]); `pick`, or `agree` across
    ranks, takes one. ``memory``, ``host``, ``rates``: _core.FitMemory, FitHost, UpdateRates.
    ``reserve``: device bytes kept from every plan (what a tried step added beyond its plan,
    stowage.fitting.trial). ``micro_count``: the micro-batches a size asked for runs as (a count
    that does not divide the rows: more than their rows' share). ``not_recomputed``: checkpoint
    regions whose tensors are kept or offloaded."""
    fractions = FRACTIONS if can_offload else (1.0,)
    shares = [(fraction, kept_on_device(memory.numels, fraction)) for fraction in fractions]
    native = traces.native.without_recompute(set(not_recomputed))
    weighed = _core.weigh_fit(native, memory, host, rates, shares, _core.ShareSearch(rows, micro_rows, smallest,
                              EXTRA_CUTS), micro_count, foreach, reserve)
    return [Option(option, lambda at: without_recompute(traces.at(at), not_recomputed)) for option in weighed]
