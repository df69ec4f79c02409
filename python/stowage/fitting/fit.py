"""``stowage.fit``: profile one step, choose where optimizer states live and plan the activations
under what is left, and hand back the step as fitted (stowage.fitting.fitted)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

import stowage.plan
from stowage import memory as stowage_memory
from stowage._core import MIN_ROWS, MicroCut, format_bytes
from stowage import _core
from stowage.fitting.accounting import measure, state_copies, uses_foreach
from stowage.fitting.batches import LossFn, LossFnNeeded, default_loss, profiling_grids, shown
from stowage.fitting.choosing import Choice, Option, StepTraces, agree, feasible_times, pick, weigh
from stowage.fitting.fitted import Fitted
from stowage.fitting.cut_check import CutCheck
from stowage.fitting.loss_units import LOSS_UNITS_GIVEN, given_units
from stowage.fitting.micro_batches import ExampleBatch
from stowage.fitting.trial import regions_of_kinds, run_once
from stowage.fitting.side_effects import untouched
from stowage.fitting.update_rates import measure_rates
from stowage.byte_counts import byte_count
from stowage.serving import device_index, memory_cap, serves, torch_module
from stowage.offload.adam import Adam, AdamW
from stowage.offload.host_memory import host_room
from stowage.offload.sharded import local
from stowage.plan.sizes import StepsDiffer, grid_points


@contextlib.contextmanager
def _trial(device: torch.device) -> Iterator[None]:
    """fit's own steps (its recording of the step, its rate probes), marked in the device's
    history ("snapshot" markers stowage.fit.trial_begin / trial_end) so that an inspection of the
    run can tell them from training (an out-of-memory while recording is fit's, not the run's)."""
    module, index = torch_module(), device_index(device)
    module.mark_fit_trial(True, index)
    try:
        yield
    finally:
        module.mark_fit_trial(False, index)


MICRO_GRID = (MIN_ROWS, MIN_ROWS + 1)  # rows a step that may be cut is recorded at


def _device_of(parameters: list[torch.nn.Parameter]) -> torch.device:
    devices = {p.device for p in parameters}
    if len(devices) != 1:
        raise ValueError(f"stowage.fit takes a model on one device, not {sorted(map(str, devices))}")
    return devices.pop()


def check_allocator(device: torch.device) -> None:
    """Raises, saying how to fix it, unless stowage serves `device`'s memory."""
    if device.type == "cuda" and not serves(device):
        raise RuntimeError(
            "stowage.fit: torch's own allocator serves CUDA memory in this process, so stowage cannot hold "
            "the step to a budget or offload its tensors. Make stowage the allocator before CUDA is first "
            "touched: start the program with STOWAGE_ALLOC_CONF set (empty for the defaults), or call "
            "stowage.enable() right after importing torch, before the first CUDA tensor.")
    if device.type == "cpu" and not serves(device):
        raise RuntimeError(
            "stowage.fit: a model on the CPU trains on stowage's CPU mode (a simulated device): call "
            "stowage.enable(device='cpu', capacity='4GiB') before building the model, or move it to a GPU.")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"stowage.fit trains on a CUDA device or in CPU mode, not on {device.type!r}")


def check_parameters_counted(parameters: list[torch.nn.Parameter], device: torch.device) -> None:
    """Raises, saying how to fix it, when parameters lie outside the memory stowage serves (in
    CPU mode, a model built before stowage.enable(): the simulated device does not hold them, so
    the budget would leave them out). On a GPU every CUDA tensor is stowage's: enable() must come
    before CUDA starts."""
    if device.type != "cpu":
        return
    module = torch_module()
    outside = [p for p in parameters if not module.cpu_owns(local(p))]
    if not outside:
        return
    size = sum(local(p).numel() * p.element_size() for p in outside)
    raise RuntimeError(
        f"stowage.fit: {len(outside)} of the model's {len(parameters)} parameters "
        f"({format_bytes(size)}) are not in CPU mode's simulated device: the model was built (or "
        "loaded) before stowage.enable(device='cpu', ...), so fit would plan without them. Build the model "
        "after enable(), or copy it in once enabled: for p in model.parameters(): p.data = p.data.clone()")


class CannotCut(Exception):
    """The step cannot be planned per micro-batch (the reason); fit keeps the batch whole."""


Profiled = tuple[StepTraces, str]  # a micro-batch's lifetime trace by its rows, and how it was recorded


def _profile(model: Any, loss_fn: LossFn, example: ExampleBatch, device: torch.device, capacity: int,
             cost: dict[str, float] | None) -> Profiled:
    """The step's lifetime trace: recorded whole at the example when it fits and is not to be
    cut; recorded at 2 and 3 rows of the example's sequences when it may be cut (every cut's
    lifetime trace is then read off the rows' line); else at a grid of smaller sizes cut from the example
    and evaluated at the example's (stowage.plan.sizes)."""
    def step(at: Any) -> None:  # gradients made and let go, as a step then the optimizer's zero_grad do
        loss_fn(model, at).backward()
        model.zero_grad(set_to_none=True)

    kind = "cuda" if device.type == "cuda" else "cpu"
    full = example.layout.sizes
    try:
        if example.units is None:
            trace = stowage.plan.profile(lambda: step(example.batch), device=kind, cost=cost, model=model)
            return StepTraces.whole(trace), f"step recorded at {shown(full)}"
        try:
            sized = stowage.plan.profile(_on_cuts(step, example, {"batch": MICRO_GRID}), sizes={"batch": MICRO_GRID},
                                         device=kind, cost=cost, model=model)
        except ValueError as error:  # the step's ops differ between 2 and 3 rows, or it refuses so few
            model.zero_grad(set_to_none=True)
            why = "its ops differ with the rows" if isinstance(error, StepsDiffer) else "it fails on 2 or 3 rows"
            raise CannotCut(f"{why} ({str(error).splitlines()[0]})") from None
        rest = f" x seq {example.layout.seq}" if example.layout.seq is not None else ""
        return StepTraces.by_rows(sized, {}), (
            f"step recorded at batch {{{', '.join(map(str, MICRO_GRID))}}}{rest}, planned per micro-batch")
    except torch.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
    sized, grid_shown, failures = _record_smaller(step, example, kind, cost, model)
    if sized is None:
        model.zero_grad(set_to_none=True)
        if not all(isinstance(error, torch.OutOfMemoryError) for _, error in failures):
            raise _cut_fails(full, failures)
        grid = profiling_grids(example.layout)[-1]
        raise _too_large(model, device, capacity, {name: values[0] for name, values in grid.items()},
                         _first_line(failures[-1][1]))
    grid = sized.sizes
    if example.units is not None:
        return StepTraces.by_rows(sized, {name: full[name] for name in grid}), (
            f"step does not fit at 2 rows: recorded at {grid_shown}, planned per micro-batch")
    trace = sized.at({name: full[name] for name in grid})
    return StepTraces.whole(trace), f"step does not fit whole: recorded at {grid_shown}, planned at {shown(full)}"


def _on_cuts(step: Callable[[Any], None], example: ExampleBatch,
             grid: dict[str, tuple[int, ...]]) -> Callable[..., None]:
    """`step` on the example cut to each point of `grid`, the cuts made before anything is
    recorded: cutting is no part of the step (recorded, its copies would count in the step's
    memory and its ops among the step's, and those can change with the point: indexing a
    dimension to its full length is an alias, or nothing, where a shorter one is a slice)."""
    pieces = {tuple(point.items()): example.layout.at(example.batch, point) for point in grid_points(grid)}
    return lambda **sizes: step(pieces[tuple(sizes.items())])


Failures = list[tuple[str, Exception]]  # each grid tried (as shown) and why it could not be recorded there


def _record_smaller(step: Callable[[Any], None], example: ExampleBatch, kind: str, cost: dict[str, float] | None,
                    model: Any) -> tuple[Any, str, Failures]:
    """The step recorded at the first of profiling_grids that it fits and runs the same ops at:
    (the sized trace, the grid shown, the grids tried before) or (None, "", every grid tried and
    its failure). A failed recording leaves the device as it found it (stowage.plan.profile), so
    each grid has the room the first had."""
    failures: Failures = []
    for grid in profiling_grids(example.layout):
        grid_shown = " x ".join(f"{name} {{{', '.join(map(str, values))}}}" for name, values in grid.items())
        try:
            sized = stowage.plan.profile(_on_cuts(step, example, grid), sizes=grid, device=kind, cost=cost,
                                         model=model)
            return sized, grid_shown, failures
        except LossFnNeeded:
            model.zero_grad(set_to_none=True)
            raise
        except (torch.OutOfMemoryError, RuntimeError, ValueError, TypeError, IndexError) as error:
            failures.append((grid_shown, error))
        model.zero_grad(set_to_none=True)
    return None, "", failures


def _first_line(error: Exception) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"


def _too_large(model: Any, device: torch.device, capacity: int, smallest: dict[str, int],
               failure: str) -> torch.OutOfMemoryError:
    trainable = sum(local(p).numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return torch.OutOfMemoryError(
        f"stowage.fit: the step does not fit as it is even cut to {shown(smallest)}, the smallest size fit "
        f"records it at (a recording runs the step unplanned, with nothing offloaded). In use before it: "
        f"{format_bytes(stowage_memory.memory_allocated(device))} of {format_bytes(capacity)}; its gradients add "
        f"{format_bytes(trainable)}. The device cannot hold the model with the smallest step's activations: shard "
        "it over more devices (FSDP2), train it in lower precision, or on smaller inputs (shorter sequences, "
        f"smaller images).\n({failure})")


def _cut_fails(full: dict[str, int], failures: Failures) -> ValueError:
    tried = "\n".join(f"  at {grid}: {_first_line(error)}" for grid, error in failures)
    if any(isinstance(error, StepsDiffer) for _, error in failures):
        advice = ("A step recorded at several sizes must run the same ops at each: a loss computed in a fixed "
                  "number of chunks (not chunks of a fixed size), no branch on the sizes. Else: "
                  "micro_batches='auto' (fit then records 2 and 3 rows at the example's own sequence length), an "
                  "example batch whose step fits whole, or a device or budget the example's step fits in")
    else:
        advice = ("fit cuts rows (the first dimension of every tensor with the example's rows) and sequences (the "
                  "second dimension of integer tensors with the example's length): give a step that takes fewer "
                  "of them, or a budget the example's step fits in whole")
    return ValueError(
        f"stowage.fit: the step does not fit whole at {shown(full)}, so fit records it on the example cut to "
        f"smaller sizes, and it could not be recorded at any of them:\n{tried}\n{advice}")


def offload_refusal(optimizer: torch.optim.Optimizer) -> str:
    """Why `optimizer` cannot move its states to the host as it is ("" when it can): the offloaded
    optimizers are torch's Adam and AdamW, with every option but differentiable=True."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return f"{type(optimizer).__name__} has no offloaded twin (Adam and AdamW have)"
    if any(group.get("differentiable") for group in optimizer.param_groups):
        return "differentiable=True needs the update in autograd, on the device"
    dtypes = {p.dtype for g in optimizer.param_groups for p in g["params"]}
    if not dtypes <= {torch.float32, torch.bfloat16, torch.float16}:
        return f"parameters of {sorted(map(str, dtypes))} (the host update takes float32, bfloat16 and float16)"
    return ""


def _host_memory(optimizer: torch.optim.Optimizer, host_budget: int | str | None) -> Any:
    """What an offloaded parameter of `optimizer`'s takes on the host (in the default exact mode:
    one gradient staging buffer), and the room the process has there (a _core.FitHost)."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    amsgrad = any(group.get("amsgrad") for group in optimizer.param_groups)
    per_parameter = max((torch_module().bytes_per_parameter(p.dtype, 1, amsgrad) for p in parameters if p.requires_grad), default=0)
    room = host_room(None if host_budget is None else byte_count(host_budget, "stowage.fit: host_budget"))
    limited_by = "host_budget" if room.limited_by == "host_memory_limit" else room.limited_by
    return _core.FitHost(per_parameter, room.available_bytes, limited_by)


def _offloaded(optimizer: torch.optim.Optimizer, fraction: float, model: Any,
               host_budget: int | str | None = None) -> torch.optim.Optimizer:
    """stowage.offload.Adam or AdamW with `optimizer`'s groups and every option they carry,
    `fraction` of the states on the device; attached to DDP's all-reduce when the model is wrapped
    in DDP."""
    twin = AdamW if type(optimizer) is torch.optim.AdamW else Adam
    groups = [dict(group) for group in optimizer.param_groups]
    offloaded = twin(groups, device_fraction=fraction, host_memory_limit=host_budget)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        offloaded.attach(model)
    return offloaded


def _agreed(options: list[Option]) -> Choice | None:
    """The choice this process takes. Under torch.distributed every rank takes the same one (where
    the update runs changes its rounding, parameters must stay identical across ranks, and the
    ranks' micro-batches meet in one all-reduce): one that fits every rank's device, weighed by
    the slowest rank's prediction."""
    mine = feasible_times(options)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return pick(mine)
    every: list[dict[Choice, float]] = [{} for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather_object(every, mine)
    return agree(every)


@dataclass(frozen=True)
class Weighing:
    """What every weighing of the options takes (stowage.fitting.choosing.weigh)."""

    traces: StepTraces
    memory: Any  # _core.FitMemory
    host: Any    # _core.FitHost
    rates: Any   # _core.UpdateRates
    rows: int
    cut: MicroCut | None  # None: fit chooses
    can_offload: bool
    foreach: bool

    def options(self, reserve: int, no_recompute: set[str]) -> list[Option]:
        return weigh(self.traces, self.memory, self.host, self.rates, rows=self.rows,
                     micro_rows=self.cut.most if self.cut else None, micro_count=self.cut.count if self.cut else None,
                     smallest=MIN_ROWS, can_offload=self.can_offload, foreach=self.foreach, reserve=reserve,
                     not_recomputed=regions_of_kinds(self.traces.regions, no_recompute))


TRIALS = 3  # choices tried at most (stowage.fitting.trial)


def _choose(weighing: Weighing, model: Any, loss_fn: LossFn, example: ExampleBatch,
            device: torch.device) -> tuple[list[Option], Option | None, str]:
    """The options and the one taken, its plan tried once on the example's first micro-batch
    (stowage.fitting.trial): a step that adds more than predicted is weighed again with the
    overshoot kept back from every plan (the planner's error on this step, taken to be as large
    on the next plan: a plan that then overshoots by no more than what was kept back fits), a
    block kind whose recompute fails is left out of recomputation.
    Under torch.distributed the ranks take one choice untried (a retry on one rank alone would
    leave the others waiting). Returns what the trials found, for the table."""
    reserve, no_recompute, found = 0, set(), []
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    for attempt in range(TRIALS):
        options = weighing.options(reserve, no_recompute)
        choice = _agreed(options)
        chosen = next((o for o in options if o.key == choice), None)
        if chosen is None or chosen.plan is None or chosen.keeps_everything or distributed or attempt == TRIALS - 1:
            return options, chosen, "; ".join(found)
        piece = example.batch if example.units is None else \
            example.last_piece(MicroCut(example.rows, chosen.micro_batches, chosen.micro_rows))
        chosen.plan.model = model
        with _trial(device), untouched(model, device):
            outcome = run_once(model, loss_fn, piece, chosen.plan, device)
        if outcome.failed_block_kind:
            no_recompute.add(outcome.failed_block_kind)
            found.append(f"{outcome.failed_block_kind} runs other ops when recomputed: not recomputed")
        elif outcome.overshoot > reserve:  # (a plan made with `reserve` kept back may overshoot by as much)
            reserve = outcome.overshoot
            found.append(f"the step added {format_bytes(outcome.overshoot)} more than planned: weighed again with it "
                         "kept back")
        else:
            return options, chosen, "; ".join(found)
    raise AssertionError("unreachable")


def _units(check: CutCheck, example: ExampleBatch, micro_batches: int | str,
           loss_units: str | Callable[[Any], float] | None, device: torch.device) -> ExampleBatch:
    """The example with what its loss is a mean over, verified on it (stowage.fitting.cut_check)
    at the finest cut fit may take and the count asked for; or as the caller says, the step checked
    only for ops that mix rows. Where the batch is not to be cut, micro_batches="auto" keeps it
    whole and a count asked for is refused."""
    with _trial(device):
        if loss_units is not None:
            why_not = check.mixing()
            found = example.whole(why_not) if why_not else example.with_units(given_units(loss_units), LOSS_UNITS_GIVEN)
        else:
            found = check.verify([MicroCut.finest(example.rows), *([example.cut] if example.cut else [])])
    if found.units is None and micro_batches != "auto":
        raise ValueError(f"stowage.fit: micro_batches={micro_batches} cannot be kept to the global batch's step: "
                         f"{found.not_cut}")
    return found


def _checked_choice(weighing: Weighing, example: ExampleBatch, check: CutCheck | None, model: Any, loss_fn: LossFn,
                    device: torch.device) -> tuple[Weighing, ExampleBatch, tuple[list[Option], Option | None, str]]:
    """fit's choice, its cut verified on the example batch where fit chose it ("auto", the units
    not given): a cut the check does not verify (on any rank, under torch.distributed, where the
    ranks took one choice) is weighed again whole, saying why."""
    choice = _choose(weighing, model, loss_fn, example, device)
    chosen = choice[1]
    verify = check is not None and weighing.cut is None and example.checked != LOSS_UNITS_GIVEN
    if not verify or chosen is None or chosen.micro_batches == 1:
        return weighing, example, choice
    assert check is not None
    with _trial(device):
        verified = check.verify([MicroCut(weighing.rows, chosen.micro_batches, chosen.micro_rows)])
    why_not = verified.not_cut
    if torch.distributed.is_available() and torch.distributed.is_initialized():  # the ranks cut alike, or none does
        every: list[str] = [""] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, why_not)
        why_not = next((said for said in every if said), "")
        if why_not and verified.units is not None:
            why_not = f"another rank's example batch does not verify the cut ({why_not})"
    if not why_not:
        return weighing, verified, choice
    whole = example.whole(why_not)
    weighing = dataclasses.replace(weighing, cut=whole.cut)
    return weighing, whole, _choose(weighing, model, loss_fn, whole, device)


def _no_fit(options: list[Option], memory: Any, unplanned: int, refusal: str,
            tried: str = "", whole: str = "") -> torch.OutOfMemoryError:
    lines = [f"  {o.fraction:.0%} of the states on the device"
             + (f", {o.micro_batches} micro-batches of {o.micro_rows} rows" if o.micro_batches > 1 else "")
             + f" (room for the step {format_bytes(max(o.activation_budget, 0))}): "
             f"{o.reason or 'fits here, not on every rank'}" for o in options]
    if refusal:
        lines.append(f"  (the states cannot move to host memory: {refusal})")
    if tried:
        lines.append(f"  (tried before training: {tried})")
    if whole:
        lines.append(f"  (the batch runs whole: {whole})")
    return torch.OutOfMemoryError(
        f"stowage.fit: the step does not fit in {format_bytes(memory.usable)} usable "
        f"({format_bytes(memory.in_use)} in use before it, states "
        f"{format_bytes(memory.states)}, gradients {format_bytes(memory.gradients)}, "
        f"the step adding {format_bytes(unplanned)} unplanned) with any share of optimizer "
        "states on the device:\n" + "\n".join(lines) +
        "\nTrain on a smaller batch or sequence, or on a larger device"
        + (", or give the offloaded states more host memory." if any("the host cannot" in o.reason for o in options)
           else "."))


def fit(model: Any, optimizer_factory: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
        example_batch: Any, loss_fn: LossFn | None = None, budget: int | str | None = None, *,
        verbose: bool = True, cost: dict[str, float] | None = None, offload_optimizer: bool = True,
        host_budget: int | str | None = None, micro_batches: int | str = 1,
        loss_units: str | Callable[[Any], float] | None = None, split_batchnorm: bool = False) -> Fitted:
    """Fits ``model``'s training step to its device; see stowage.fitting. ``example_batch``: the
    largest batch the loop trains on (with ``micro_batches``, its global batch). ``budget``: the
    device memory training may use (default: all of it). ``host_budget``: the host memory the
    offloaded states may take (default: what the process may take, cgroup limits included).
    ``cost``: the planner's cost model (measured when not given).
    ``offload_optimizer=False`` keeps the factory's optimizer with all its states on the device
    (the plan alone makes room). ``micro_batches``: 1 runs the batch whole; "auto" lets fit cut it
    into the micro-batches that make the fastest step that fits, a count cuts it into that many;
    ``fitted.step(batch)`` then runs them (Note [Micro-batches] in stowage.fitting.micro_batches:
    each loss weighted by its share of the units the example batch verifies, or of
    ``loss_units`` when given, unchecked; batch norm in training mode refuses a cut unless
    ``split_batchnorm=True``)."""
    loss_fn = loss_fn or default_loss
    cost = dict(cost) if cost is not None else None
    parameters = list(model.parameters())
    device = _device_of(parameters)
    check_allocator(device)
    check_parameters_counted(parameters, device)
    capacity, bound = memory_cap(device)
    if budget is not None and byte_count(budget, "stowage.fit: budget") < capacity:
        capacity, bound = byte_count(budget, "stowage.fit: budget"), "the budget"
    optimizer = optimizer_factory(parameters)
    if any(optimizer.state.values()):
        raise ValueError("stowage.fit: the optimizer already holds states; give a factory that makes a fresh one")
    example = ExampleBatch.of(example_batch, micro_batches)
    check = None if example.runs_whole else CutCheck(model, loss_fn, example, device, split_batchnorm)
    if check is not None:
        example = _units(check, example, micro_batches, loss_units, device)
    try:
        with _trial(device), untouched(model, device):  # the recorded step leaves no trace in training
            traces, recorded = _profile(model, loss_fn, example, device, capacity, cost)
    except CannotCut as error:
        if micro_batches != "auto":
            raise ValueError(f"stowage.fit: micro_batches={micro_batches} cannot be planned: {error}") from None
        example = example.whole(str(error))
        with _trial(device), untouched(model, device):
            traces, recorded = _profile(model, loss_fn, example, device, capacity, cost)
    ordered = [p for group in optimizer.param_groups for p in group["params"]]  # the order shares split by
    # What is in use before the step, garbage not counted: a reference cycle the recorded step left
    # would otherwise count or not as the collector happened to run.
    gc.collect()
    memory = measure(ordered, stowage_memory.memory_allocated(device), capacity, state_copies(optimizer))
    with _trial(device):
        rates = measure_rates(device, parameters[0].dtype)
    load = (os.getloadavg()[0], len(os.sched_getaffinity(0)))  # the host while fit measured
    refusal = offload_refusal(optimizer) if offload_optimizer else "offload_optimizer=False"
    host = _host_memory(optimizer, host_budget)
    weighing = Weighing(traces, memory, host, rates, example.rows, example.cut, not refusal, uses_foreach(optimizer))
    weighing, example, (options, chosen, tried) = _checked_choice(weighing, example, check, model, loss_fn, device)
    if chosen is None:
        whole = example.not_cut or ("micro_batches=1; micro_batches='auto' lets fit cut it into micro-batches"
                                    if micro_batches == 1 and example.rows > MIN_ROWS else "")
        unplanned = traces.at(example.cut.most if example.cut else example.rows).unconstrained_peak_bytes
        raise _no_fit(options, memory, unplanned, refusal, tried, whole)
    if chosen.fraction < 1.0:
        optimizer = _offloaded(optimizer, chosen.fraction, model, host_budget)
    name = type(optimizer).__module__ + "." + type(optimizer).__qualname__
    facts = {"device": f"{device} (stowage's CPU mode)" if device.type == "cpu" else str(device),
             "capacity": capacity, "capacity_bound": bound, "recorded": recorded, "memory": memory,
             "optimizer": name, "load": load, "unplanned_peak": traces.at(chosen.micro_rows).unconstrained_peak_bytes,
             "states_kept_because": refusal, "host": host, "tried": tried}
    example = example.cut_into(chosen.micro_batches, chosen.micro_rows or example.rows)
    fitted = Fitted(model, optimizer, loss_fn, chosen, options, example, facts)
    if verbose:
        print(fitted)
    return fitted
