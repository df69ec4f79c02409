"""``stowage.fit``: profile one step, choose where optimizer states live and plan the activations
under what is left, and hand back the step as fitted (stowage.fitting.fitted)."""

from __future__ import annotations

import gc
import os
from typing import Any, Callable

import torch

from stowage import _core
from stowage import memory as stowage_memory
from stowage._core import MIN_ROWS, MicroCut, format_bytes
from stowage.byte_counts import byte_count
from stowage.fitting.batches import LOSS_UNITS_GIVEN, ExampleBatch, LossFn, default_loss, given_units
from stowage.fitting.choosing import TrialParameters, Weighing, checked_choice, distributed
from stowage.fitting.cut_check import CutCheck
from stowage.fitting.fitted import Fitted
from stowage.fitting.measuring import measure, measure_blocks, measure_rates, state_copies, uses_foreach
from stowage.fitting.recording import record
from stowage.fitting.side_effects import fit_trial
from stowage.offload import host_room
from stowage.offload.adam import STAGED_BUCKET_NUMEL, STAGING_SLOTS, Adam, AdamW
from stowage.offload.sharded import local
from stowage.serving import memory_cap, serves, torch_module


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
    """Raises, saying how to fix it, when parameters lie outside CPU mode's simulated device (a model
    built before stowage.enable(): the budget would leave them out)."""
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
    """A _core.FitHost: what an offloaded parameter takes on the host with update="exact" (its
    states), its staging ring's bound (Note [Staged buckets]: up to three buckets' parameters and
    gradients), and the process's room there."""
    trained = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    amsgrad = any(group.get("amsgrad") for group in optimizer.param_groups)
    per_parameter = max((torch_module().staged_bytes_per_parameter(p.dtype, amsgrad) for p in trained), default=0)
    bucket_bytes = max((max(STAGED_BUCKET_NUMEL, p.numel()) * p.dtype.itemsize for p in trained), default=0)
    room = host_room(None if host_budget is None else byte_count(host_budget, "stowage.fit: host_budget"))
    limited_by = "host_budget" if room.limited_by == "host_memory_limit" else room.limited_by
    return _core.FitHost(per_parameter, room.available_bytes, limited_by, bucket_bytes, STAGING_SLOTS)


def _placement(model: Any, offload_parameters: bool | str | None, blocks: Any) -> Any:
    """Where the weighing may keep the blocks' parameters (a _core.ParameterPlacement): on the
    device (False), on the host (True), either, the weighing choosing ("auto"), or on the device
    unless no option fits there (None, the default); the device alone under torch.distributed or
    DDP (whose all-reduce expects them there) unless True."""
    if offload_parameters is False:
        return _core.ParameterPlacement.DEVICE
    if offload_parameters is True:
        if blocks.units == 0 or blocks.parameter_bytes == 0:
            raise ValueError("stowage.fit: offload_parameters=True, but the model has no repeated blocks with "
                             "parameters (the items of an nn.ModuleList or nn.Sequential) to keep on the host")
        return _core.ParameterPlacement.HOST
    if offload_parameters is not None and offload_parameters != "auto":
        raise ValueError("stowage.fit: offload_parameters is None (the default), True, False or 'auto', not "
                         f"{offload_parameters!r}")
    if distributed() or isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return _core.ParameterPlacement.DEVICE
    if offload_parameters is None:
        return _core.ParameterPlacement.DEVICE_UNLESS_NONE_FITS
    return _core.ParameterPlacement.EITHER


def _training_optimizer(model: Any, optimizer: torch.optim.Optimizer, chosen: Any, refusal: str,
                        host_budget: int | str | None) -> torch.optim.Optimizer:
    """The factory's optimizer, or its offloaded twin with the factory's groups (on DDP's all-reduce
    under DDP) where `chosen` sends a share of the states to the host or keeps the blocks'
    parameters there (its host kernel updates them in place) and nothing refused the twin."""
    if chosen.fraction == 1.0 and not (chosen.parameters_on_host and not refusal):
        return optimizer
    twin = AdamW if type(optimizer) is torch.optim.AdamW else Adam
    offloaded = twin([dict(group) for group in optimizer.param_groups], device_fraction=chosen.fraction,
                     host_memory_limit=host_budget)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        offloaded.attach(model)
    return offloaded


def _units(check: CutCheck, example: ExampleBatch, micro_batches: int | str,
           loss_units: str | Callable[[Any], float] | None, device: torch.device) -> ExampleBatch:
    """The example with what its loss is a mean over, verified (cut_check) at the finest cut and the
    count asked for, or as the caller says (then checked only for ops that mix rows). A batch not
    to be cut runs whole under micro_batches="auto"; a count asked for is refused."""
    with fit_trial(device):
        if loss_units is not None:
            why_not = check.mixing()
            found = example.whole(why_not) if why_not else example.with_units(given_units(loss_units), LOSS_UNITS_GIVEN)
        else:
            found = check.verify([MicroCut.finest(example.rows), *([example.cut] if example.cut else [])])
    if found.units is None and micro_batches != "auto":
        raise ValueError(f"stowage.fit: micro_batches={micro_batches} cannot be kept to the global batch's step: "
                         f"{found.not_cut}")
    return found


def fit(model: Any, optimizer_factory: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
        example_batch: Any, loss_fn: LossFn | None = None, budget: int | str | None = None, *,
        verbose: bool = True, cost: dict[str, float] | None = None, offload_optimizer: bool = True,
        host_budget: int | str | None = None, micro_batches: int | str = 1,
        loss_units: str | Callable[[Any], float] | None = None, split_batchnorm: bool = False,
        offload_parameters: bool | str | None = None) -> Fitted:
    """Fits ``model``'s training step to its device (README's "Fitting a larger model"):
    ``example_batch`` is the largest batch the loop trains on (with ``micro_batches``, its global
    batch); ``budget`` and ``host_budget`` cap the device and host memory (default: all the
    process may take); ``cost``: the planner's cost model (measured when not given);
    ``offload_optimizer=False`` keeps the factory's optimizer whole on the device;
    ``micro_batches``: 1 (whole), "auto" (fit chooses) or a count; ``loss_units`` says what the
    loss is a mean over, unchecked; ``split_batchnorm=True`` lets batch norm in training mode be
    cut; ``offload_parameters``: where the model's blocks' parameters live: None (the default: on
    the device unless no option fits there, then on the host where that fits), False (on the
    device), True (on the host, stowage.offload.parameters) or "auto" (the faster predicted step)."""
    loss_fn = loss_fn or default_loss
    cost = dict(cost) if cost is not None else None
    parameters = list(model.parameters())
    devices = {p.device for p in parameters}
    if len(devices) != 1:
        raise ValueError(f"stowage.fit takes a model on one device, not {sorted(map(str, devices))}")
    device = devices.pop()
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
    traces, recorded, example = record(model, loss_fn, example, device, capacity, cost, micro_batches)
    ordered = [p for group in optimizer.param_groups for p in group["params"]]  # the order shares split by
    # What is in use before the step, garbage not counted: a reference cycle the recorded step left
    # would otherwise count or not as the collector happened to run.
    gc.collect()
    memory = measure(ordered, stowage_memory.memory_allocated(device), capacity, state_copies(optimizer))
    with fit_trial(device):
        rates = measure_rates(device, parameters[0].dtype, optimizer, list(memory.numels))
    load = (os.getloadavg()[0], len(os.sched_getaffinity(0)))  # the host while fit measured
    refusal = offload_refusal(optimizer) if offload_optimizer else "offload_optimizer=False"
    host = _host_memory(optimizer, host_budget)
    # CPU mode counts host tensors as the device's: torch's states of the blocks' host parameters land
    # there where the factory's optimizer stays; the offloaded twin keeps them in its host store.
    blocks = measure_blocks(model, state_copies(optimizer), device.type == "cpu" and bool(refusal))
    weighing = Weighing(traces, memory, host, rates, example.rows, example.cut, not refusal, uses_foreach(optimizer),
                        blocks, _placement(model, offload_parameters, blocks))
    parameters = TrialParameters(model)  # the blocks' parameters on the host, from the first trial there
    try:
        example, (options, chosen, tried) = checked_choice(weighing, example, check, model, loss_fn, device,
                                                           parameters)
        if chosen is None:
            whole = example.not_cut or ("micro_batches=1; micro_batches='auto' lets fit cut it into micro-batches"
                                        if micro_batches == 1 and example.rows > MIN_ROWS else "")
            unplanned = traces.at(example.cut.most if example.cut else example.rows).unconstrained_peak_bytes
            weighed = [o.weighed for o in options]
            raise torch.OutOfMemoryError(_core.no_fit_message(weighed, memory, unplanned, refusal, tried, whole))
        optimizer = _training_optimizer(model, optimizer, chosen, refusal, host_budget)
        name = type(optimizer).__module__ + "." + type(optimizer).__qualname__
        facts = {"device": f"{device} (stowage's CPU mode)" if device.type == "cpu" else str(device),
                 "capacity": capacity, "capacity_bound": bound, "recorded": recorded, "memory": memory,
                 "optimizer": name, "load": load, "unplanned_peak": traces.at(chosen.micro_rows).unconstrained_peak_bytes,
                 "states_kept_because": refusal, "host": host, "tried": tried, "blocks": blocks}
        example = example.cut_into(chosen.micro_batches, chosen.micro_rows or example.rows)
        # The blocks' parameters on the host where the choice keeps them there, as far ahead as it weighed
        # (Note [Parameter prefetch depth]): the trials' handle where they ran at that depth; the Fitted's.
        fitted = Fitted(model, optimizer, loss_fn, chosen, options, example, facts, parameters.taken_by(chosen))
    except BaseException:
        parameters.close()  # a refusal leaves the model as it found it: its parameters on the device
        raise
    if verbose:
        print(fitted)
    return fitted
