"""`fit`'s choice: the share of optimizer states on the device, the micro-batches and the plan for
the activations, weighed in one call into the planner (Note [Weighing fit's options] in planner/
fit_weighing.hpp), then tried once before training (README's "Fitting a larger model"). An
overshoot found is kept back from every plan weighed again: the planner's error on this step, taken
to be as large on the next plan.

Contract: the trial restores what the step changes (side_effects); one trial at a time, on the
thread that trains.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from stowage import _core, memory
from stowage._core import MIN_ROWS, MicroCut, format_bytes
from stowage.fitting.batches import LOSS_UNITS_GIVEN, ExampleBatch, LossFn
from stowage.fitting.cut_check import CutCheck
from stowage.fitting.side_effects import fit_trial, untouched
from stowage.offload.parameters import ParameterOffloadError
from stowage.offload.parameters import parameters as offloaded_parameters
from stowage.plan import LifetimeTrace, Plan, SizedTrace
from stowage.plan.applying import recompute_unannounced
from stowage.serving import torch_module

FRACTIONS = (1.0, 0.75, 0.5, 0.25, 0.0)
TIE = 0.03
EXTRA_CUTS = 3  # halvings weighed below the largest micro-batch that fits
TRIALS = 3  # choices tried at most
OUT_OF_MEMORY_OVERSHOOT = 16 << 20  # taken for a tried step that ran out of memory (at least; fit's margin)
RECOMPUTE_FAILURE = re.compile(r"stowage\.plan: block '([^']*)' ran .* when recomputed")

Choice = tuple[float, int, bool]  # (share of states on the device, rows of a micro-batch, parameters on the host)
TraceAt = Callable[[int], LifetimeTrace]  # one micro-batch's lifetime trace, by its rows


def distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@dataclass(frozen=True)
class StepTraces:
    """One micro-batch's lifetime trace by its rows (``native``: a _core.StepTraces, what is
    weighed and what a plan applies); ``regions``: its checkpoint regions, alike at any rows."""

    native: Any
    regions: list[Any]

    def at(self, rows: int) -> LifetimeTrace:
        return self.native.at(rows)

    @staticmethod
    def whole(trace: LifetimeTrace) -> StepTraces:  # a step recorded once, the same at any rows
        return StepTraces(_core.StepTraces(trace, trace.cost), trace.regions)

    @staticmethod
    def by_rows(sized: SizedTrace, sizes: dict[str, int], rows_size: str = "batch") -> StepTraces:
        """A step recorded at a grid, at `sizes`, the rows in `rows_size`."""
        first = sized.traces[0]
        native = _core.StepTraces(sized.native, [sizes.get(name, 0) for name in sized.sizes],
                                  list(sized.sizes).index(rows_size), first.cost)
        return StepTraces(native, first.regions)


class Option:
    """One weighed option (its _core.FitOption's figures) and its plan, made where it was solved."""

    def __init__(self, weighed: Any, trace_at: TraceAt) -> None:
        self.weighed, self._trace_at = weighed, trace_at

    def __getattr__(self, name: str) -> Any:  # the weighed figures (not its own: a copy being made has none yet)
        if name.startswith("_") or name == "weighed":
            raise AttributeError(name)
        return getattr(self.weighed, name)

    @property
    def key(self) -> Choice:
        return (self.fraction, self.micro_rows, self.parameters_on_host)

    @functools.cached_property
    def plan(self) -> Plan | None:  # None where none was solved (the states alone fill a device or host)
        if not self.weighed.solved:
            return None
        trace = self._trace_at(self.micro_rows)
        cost = trace.cost
        cost = _core.CostModel(cost.to_host_bytes_per_ms, cost.to_device_bytes_per_ms, self.weighed.prefetch_depth)
        return Plan(trace.with_cost(cost), self.weighed.decisions, self.activation_budget)


def _agreed(options: list[Option], rows: int) -> Choice | None:
    """The choice this process takes: the step as given where it fits so (every state on the device,
    the batch of `rows` whole, nothing recomputed or offloaded), else the fastest feasible one,
    within TIE the parameters on the device, then the most rows, then the most states
    (planner/share_search.hpp). Under torch.distributed every rank takes the same one, the fastest
    feasible on every rank timed by its slowest (where the update runs changes its rounding,
    parameters must stay identical across ranks, and the ranks' micro-batches meet in one all-reduce)."""
    mine = {o.key: o.step_ms for o in options if o.feasible}
    if not distributed():
        as_given = (1.0, rows, False)
        given = next((o for o in options if o.key == as_given and o.feasible and o.keeps_everything), None)
        return _core.pick_choice(mine, TIE, None if given is None else as_given)
    every: list[dict[Choice, float]] = [{} for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather_object(every, mine)
    return _core.agree_choice(every, TIE)


def block_kind(path: str) -> str:  # "model.layers.5" -> "model.layers.*"
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", path)


@dataclass(frozen=True)
class Weighing:
    """What every weighing takes (``memory``, ``host``, ``rates``, ``blocks``: _core.FitMemory,
    FitHost, UpdateRates, FitBlocks; ``placement``: a _core.ParameterPlacement, where the blocks'
    parameters may live); ``cut`` None where fit chooses the micro-batches."""

    traces: StepTraces
    memory: Any
    host: Any
    rates: Any
    rows: int
    cut: MicroCut | None
    can_offload: bool
    foreach: bool
    blocks: Any
    placement: Any

    def options(self, reserve: int, no_recompute: set[str]) -> list[Option]:
        """Every share weighed at the cut asked for, or where fit chooses, at the largest micro-batch
        that fits and up to EXTRA_CUTS halvings; ``reserve``: device bytes kept from every plan;
        ``no_recompute``: block kinds whose tensors are kept or offloaded."""
        fractions = FRACTIONS if self.can_offload else (1.0,)
        shares = [(f, torch_module().kept_on_device(self.memory.numels, f)) for f in fractions]
        excluded = {i for i, region in enumerate(self.traces.regions) if block_kind(region.module) in no_recompute}
        search = _core.ShareSearch(self.rows, self.cut.most if self.cut else None, MIN_ROWS, EXTRA_CUTS)
        traces = self.traces.native.without_recompute(excluded)
        weighed = _core.weigh_fit(traces, self.memory, self.host, self.rates, shares, search,
                                  self.cut.count if self.cut else None, self.foreach, reserve, self.blocks,
                                  self.placement)
        sent = functools.partial(_gradients_sent, traces, self.blocks.unit_gradients)  # as the host options weighed it
        return [Option(option, sent if option.parameters_on_host else traces.at) for option in weighed]


def _gradients_sent(traces: Any, unit_gradients: list[tuple[str, int]], rows: int) -> LifetimeTrace:
    """A micro-batch's trace with the blocks' gradients leaving as backward passes each block."""
    return _core.with_gradients_sent(traces.at(rows), unit_gradients)


class TrialParameters:
    """The blocks' parameters on the host for fit's trials, and for training after them: one
    stowage.offload.parameters handle, opened by the first trial of an option that keeps them there,
    kept across trials at the same depth, closed before a trial with them on the device, and handed
    to training where the option taken keeps them there at that depth (else closed): each parameter
    crosses to the host once, not once for the trials and again for training.

    A model whose parameters hold gradients when fit starts has each trial's handle closed at the
    trial's end, as side_effects.untouched puts those gradients back on the parameters' device.

    Contract: owned by one fit call, which calls ``close()`` when it raises; on fit's thread."""

    def __init__(self, model: Any) -> None:
        self._model, self._handle, self._prefetch = model, None, -1
        self.kept_across_trials = all(p.grad is None for p in model.parameters())

    def hold(self, prefetch: int) -> None:
        if self._handle is not None and self._prefetch != prefetch:
            self.close()
        if self._handle is None:
            self._handle, self._prefetch = offloaded_parameters(self._model, prefetch=prefetch), prefetch

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            handle.close()

    def taken_by(self, chosen: Option) -> Any:
        """The handle training keeps where `chosen` keeps the parameters on the host (the trials'
        where its depth is theirs, else a new one), None where it keeps them on the device."""
        if not chosen.parameters_on_host:
            self.close()
            return None
        self.hold(chosen.parameter_prefetch)
        handle, self._handle = self._handle, None
        return handle


def _run_once(model: Any, loss_fn: LossFn, piece: Any, chosen: Option, device: torch.device,
              parameters: TrialParameters) -> tuple[int, str]:
    """`piece`'s forward and backward as `chosen` trains (its plan; the blocks' parameters on the
    host where it keeps them there, held in `parameters`): the bytes added beyond the prediction and
    the parameters' window (0 where it held), and the block kind whose recompute failed ("" where
    none did)."""
    plan = chosen.plan
    assert plan is not None
    model.zero_grad(set_to_none=True)
    floor, added = 0, 0
    try:
        if chosen.parameters_on_host:
            parameters.hold(chosen.parameter_prefetch)
        else:
            parameters.close()
        start = memory.memory_allocated(device)
        memory.reset_peak_stats(device)
        try:
            with recompute_unannounced(), plan:  # (training's plan says it recomputes, if it does)
                loss_fn(model, piece).backward()
        finally:
            added = memory.max_memory_allocated(device) - start
    except torch.OutOfMemoryError:
        floor = OUT_OF_MEMORY_OVERSHOOT
    except RuntimeError as error:
        found = RECOMPUTE_FAILURE.search(str(error))
        if found is None:
            raise
        return 0, block_kind(found.group(1))
    finally:
        model.zero_grad(set_to_none=True)  # (the trial's gradients, before any parameter goes back)
        if not parameters.kept_across_trials:
            parameters.close()
    return max(added - plan.predicted_peak_bytes - chosen.window_bytes, floor), ""


Chosen = tuple[list[Option], Option | None, str]  # the options, the one taken, what the trials found


def choose(weighing: Weighing, model: Any, loss_fn: LossFn, example: ExampleBatch, device: torch.device,
           parameters: TrialParameters) -> Chosen:
    """The options and the one taken, its plan tried on the example's largest micro-batch (the
    blocks' parameters held on the host in `parameters` for the trials that keep them there)."""
    reserve, no_recompute, found = 0, set(), []
    for attempt in range(TRIALS):
        options = weighing.options(reserve, no_recompute)
        choice = _agreed(options, weighing.rows)
        chosen = next((o for o in options if o.key == choice), None)
        untried = chosen is None or chosen.plan is None or (chosen.keeps_everything and not chosen.parameters_on_host)
        if untried or distributed() or attempt == TRIALS - 1:
            return options, chosen, "; ".join(found)
        assert chosen is not None and chosen.plan is not None
        piece = example.batch if example.units is None else \
            example.last_piece(MicroCut(example.rows, chosen.micro_batches, chosen.micro_rows))
        chosen.plan.model = model
        try:
            with fit_trial(device), untouched(model, device):
                overshoot, failed_block_kind = _run_once(model, loss_fn, piece, chosen, device, parameters)
        except ParameterOffloadError as error:  # "auto" and None leave them on the device; True says why
            parameters.close()
            if weighing.placement == _core.ParameterPlacement.HOST:
                raise
            weighing = dataclasses.replace(weighing, placement=_core.ParameterPlacement.DEVICE)
            found.append(f"the blocks' parameters cannot live on the host ({error}): weighed again on the device")
            continue
        if failed_block_kind:
            no_recompute.add(failed_block_kind)
            found.append(f"{failed_block_kind} computes otherwise when recomputed: not recomputed")
        elif overshoot > reserve:  # (a plan made with `reserve` kept back may overshoot by as much)
            reserve = overshoot
            found.append(f"the step added {format_bytes(overshoot)} more than planned: weighed again with it kept back")
        else:
            return options, chosen, "; ".join(found)
    raise AssertionError("unreachable")


def checked_choice(weighing: Weighing, example: ExampleBatch, check: CutCheck | None, model: Any, loss_fn: LossFn,
                   device: torch.device, parameters: TrialParameters) -> tuple[ExampleBatch, Chosen]:
    """fit's choice, its cut verified on the example where fit chose it ("auto", units not given):
    a cut not verified (on any rank, under torch.distributed) is weighed again whole, saying why."""
    choice = choose(weighing, model, loss_fn, example, device, parameters)
    chosen = choice[1]
    verify = check is not None and weighing.cut is None and example.checked != LOSS_UNITS_GIVEN
    if check is None or not verify or chosen is None or chosen.micro_batches == 1:
        return example, choice
    with fit_trial(device):
        verified = check.verify([MicroCut(weighing.rows, chosen.micro_batches, chosen.micro_rows)])
    why_not = verified.not_cut
    if distributed():  # the ranks cut alike, or none does
        every: list[str] = [""] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, why_not)
        why_not = next((said for said in every if said), "")
        if why_not and verified.units is not None:
            why_not = f"another rank's example batch does not verify the cut ({why_not})"
    if not why_not:
        return verified, choice
    whole = example.whole(why_not)
    return whole, choose(dataclasses.replace(weighing, cut=whole.cut), model, loss_fn, whole, device, parameters)
