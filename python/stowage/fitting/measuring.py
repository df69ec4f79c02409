"""What `fit` measures for its weighing (Note [Weighing fit's options] in planner/fit_weighing.hpp):
the device's memory (`measure`), what the model's blocks' parameters take (`measure_blocks`), and
how long the optimizer's update takes a parameter and a tensor on the host (stowage's kernel, as
the offloaded optimizer runs it) and on the device (the factory's optimizer, as torch runs it there:
Note [Update rates] in planner/fit_weighing.hpp).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch

from stowage import _core
from stowage.memory import memory_allocated
from stowage.offload import adam as offloaded
from stowage.offload.parameters import block_units
from stowage.offload.resident_adam import ResidentUpdate
from stowage.offload.sharded import local
from stowage.plan.calibration import best_seconds
from stowage.serving import memory_cap, torch_module

# Kept free of the device: the allocator's rounding (pages shared by blocks of different lives
# cannot move; on a small device a few pages are a large share) and torch's own small allocations.
MARGIN_SHARE = 0.05
MARGIN_PAGES = 8
PAGE_BYTES = 2 << 20


def state_copies(optimizer: Any) -> int:
    """Copies of each parameter the optimizer keeps as state: Adam's and AdamW's two moments (three
    with amsgrad), SGD's momentum; two for any other (a guess: give it a budget with room to spare)."""
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if any(g.get("momentum", 0) for g in optimizer.param_groups) else 0
    if isinstance(optimizer, torch.optim.Adam) and any(g.get("amsgrad") for g in optimizer.param_groups):
        return 3
    return 2


def measure(parameters: list[torch.nn.Parameter], in_use: int, capacity: int, copies: int = 2) -> Any:
    """The device's figures (a _core.FitMemory): `parameters` in the optimizer's order (what a share
    keeps follows it); ``in_use``: bytes when fit ran; ``usable``: the capacity less the margin (MARGIN_*)."""
    trainable = [local(p) for p in parameters if p.requires_grad]  # under FSDP2, this rank's shards
    sizes = [p.numel() * p.element_size() for p in trainable]
    return _core.FitMemory(
        usable=max(capacity - max(int(capacity * MARGIN_SHARE), MARGIN_PAGES * PAGE_BYTES), 0), in_use=in_use,
        parameter_count=sum(p.numel() for p in trainable), gradients=sum(sizes), foreach_temporary=sum(sizes),
        largest_parameter=max(sizes, default=0), numels=[local(p).numel() for p in parameters],
        state_bytes=[copies * local(p).numel() * p.element_size() if p.requires_grad else 0 for p in parameters])


def measure_blocks(model: Any, copies: int = 2, cpu_mode: bool = False) -> Any:
    """What the model's blocks' parameters take (a _core.FitBlocks): their bytes, their gradients'
    and states' (``copies`` of each trained parameter), each block's (its path and bytes: how far
    ahead they come in is weighed from them), each parameter once in the totals (tied weights inside
    the blocks are one parameter). ``cpu_mode``: the device is CPU mode's and the factory's optimizer
    stays, so the states torch makes for host parameters count in the device's memory (the
    offloaded twin keeps them in its host store, outside it)."""
    units = block_units(model)
    names = {id(module): name for name, module in model.named_modules()}
    seen: set[int] = set()
    parameter_bytes = gradient_bytes = trained = trained_tensors = largest = largest_gradients = 0
    unit_gradients: list[tuple[str, int]] = []  # (module path, its gradients' bytes): as the trace names it
    unit_sizes: list[int] = []
    for unit in units:
        unit_bytes = unit_gradient_bytes = 0
        for param in unit.parameters():
            size = param.numel() * param.element_size()
            unit_bytes += size
            unit_gradient_bytes += size if param.requires_grad else 0
            if id(param) in seen:
                continue
            seen.add(id(param))
            parameter_bytes += size
            if param.requires_grad:
                gradient_bytes += size
                trained += param.numel()
                trained_tensors += 1
        largest, largest_gradients = max(largest, unit_bytes), max(largest_gradients, unit_gradient_bytes)
        unit_gradients.append((names[id(unit)], unit_gradient_bytes))
        unit_sizes.append(unit_bytes)
    return _core.FitBlocks(units=len(units), parameter_bytes=parameter_bytes, gradient_bytes=gradient_bytes,
                           state_bytes=copies * gradient_bytes, trained_parameters=trained,
                           largest_unit_bytes=largest, largest_unit_gradient_bytes=largest_gradients,
                           unit_bytes=unit_sizes, unit_gradients=unit_gradients, states_counted_on_device=cpu_mode,
                           trained_tensors=trained_tensors)


def uses_foreach(optimizer: Any) -> bool:
    """Whether torch's optimizer steps through its multi-tensor path (its default on a GPU)."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return False
    if group.get("foreach") is not None:
        return bool(group["foreach"])
    return any(p.is_cuda for g in optimizer.param_groups for p in g["params"])


HOST_PROBE_NUMEL = 1 << 22  # the host's larger probe's elements at most: its states beyond the caches
DEVICE_PROBE_NUMEL = (1 << 8, 1 << 22)  # a device probe's tensors' elements at least, its elements in all at most
DEVICE_PROBE_SHARE = 16  # the probes' buffers take at most this share of free memory
TENSOR_PROBE = (64, 64)  # tensors of elements: the time a tensor adds, beside few elements
PROBE_REPEATS = 5  # each probe's median of as many, in turns: a busy host's stalls fall on all alike
HYPER = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

DECOUPLED = "decoupled_weight_decay"  # the twins set it by their class, as torch's AdamW does
MakeOptimizer = Callable[[list[torch.nn.Parameter]], Any]
Prepare = Callable[[list[int]], Callable[[], None]]  # an update of tensors of these sizes, ready to run


def _median_ms(runs: list[Callable[[], None]], synchronize: Callable[[], None]) -> list[float]:
    """Each run's median time of PROBE_REPEATS, in turns, after one untimed run each (first touches):
    the median, not the best, as fit predicts a typical step, not the luckiest."""
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(PROBE_REPEATS):
        for index, run in enumerate(runs):
            times[index].append(best_seconds(run, synchronize, repeats=1) * 1e3)
    return [statistics.median(found) for found in times]


def typical_numel(numels: list[int]) -> int:
    """The size of the tensor the middle element of the model is in (the median weighted by size):
    the size the update's per-element rate is probed at, as the step's tensors stay in or spill out
    of the caches between the update's passes over each (torch's for-loop makes a dozen)."""
    ordered = sorted(n for n in numels if n > 0)
    half, seen = sum(ordered) / 2, 0
    for numel in ordered:
        seen += numel
        if seen >= half:
            return numel
    return 0


def rates_from(prepare: Prepare, synchronize: Callable[[], None], numel: int, count: int = 4) -> tuple[float, float]:
    """(ms an element, ms a tensor) of the update `prepare` makes (Note [Update rates] in
    planner/fit_weighing.hpp), from two differences, each between probes of one kind: TENSOR_PROBE's
    small tensors against one of them (63 tensors more, few elements), `count` tensors of `numel`
    against one (many elements more); the line through both, neither term negative."""
    pieces, elements = TENSOR_PROBE
    cut, small, one, large = _median_ms([prepare([elements] * pieces), prepare([elements]), prepare([numel]),
                                         prepare([numel] * count)], synchronize)
    # cut - small = (pieces - 1) (tensor + elements element); large - one = (count - 1) (tensor + numel element)
    many, few = max((cut - small) / (pieces - 1), 0.0), (large - one) / (count - 1)
    per_element = max((few - many) / (numel - elements), 0.0) if numel > elements else 0.0
    per_tensor = many - elements * per_element
    if per_tensor < 0:  # a stalled larger probe (a busy host): the small tensors' elements taken as nothing
        per_tensor = many
    if per_element == 0.0:  # the larger probe measured no slower a tensor: its time over its elements
        per_element = max(large - count * per_tensor, 0.0) / (count * numel)
    return per_element, per_tensor


def probe_shape(typical: int, total: int, most: int) -> tuple[int, int]:
    """(elements a tensor, tensors) of the larger probe: tensors of the model's typical size, as many
    as the model's elements hold, at least four and at most `most` elements in all (its states then
    beyond the caches, as a model's are between its updates: probes of a few tensors run warm)."""
    numel = max(DEVICE_PROBE_NUMEL[0], min(typical, most // 4))
    return numel, max(4, min(total, most) // numel)


def _host_update(device: torch.device, dtype: torch.dtype, sizes: list[int]) -> Callable[[], None]:
    """The host update as it runs for parameters living on the host (ResidentUpdate: one call a
    parameter, in place, states in `dtype`'s precision as torch's Adam keeps them) over parameters
    of `sizes` elements: fp32 states for fp32 parameters, the parameter's own for bf16 and fp16."""
    threads = len(torch_module().cpus_near(""))  # every CPU the process may use
    update = ResidentUpdate(str(device), threads, device.type == "cpu")
    store = torch_module().HostStateStore(str(device))  # pinned host memory, not the device's
    parameters = [store.empty(numel, dtype).fill_(1.0) for numel in sizes]
    grads = [store.empty(numel, dtype).fill_(1e-3) for numel in sizes]
    entries = [update.fresh_states(p, amsgrad=False) for p in parameters]
    group = dict(HYPER, maximize=False, amsgrad=False)

    def run() -> None:
        for parameter, grad, entry in zip(parameters, grads, entries):
            update.update(parameter, grad, entry, group, 1.0)

    return run


def probe_optimizer(optimizer: Any) -> MakeOptimizer:
    """The optimizer the step will run, over probe parameters: `optimizer`'s class with its first
    group's settings (foreach, fused, capturable and the hyper-parameters as the factory set
    them), so torch picks the same implementation for the probe's device and flags; torch's AdamW
    with HYPER where there is none or its class cannot be made so (a class taking other arguments)."""
    if optimizer is None:
        return lambda params: torch.optim.AdamW(params, **HYPER)  # type: ignore[arg-type]
    settings = {key: value for key, value in optimizer.param_groups[0].items()
                if key != "params" and key in optimizer.defaults}

    def make(params: list[torch.nn.Parameter]) -> Any:
        try:
            return type(optimizer)(params, **settings)
        except (TypeError, ValueError, RuntimeError):
            return torch.optim.AdamW(params, **HYPER)  # type: ignore[arg-type]

    return make


def offloaded_probe(optimizer: Any) -> MakeOptimizer | None:
    """`optimizer`'s offloaded twin (stowage.offload.Adam or AdamW) with no state on the device, its
    first group's settings, over probe parameters: the offloaded share's step() as it streams (Note
    [Staged buckets]); None where the optimizer has no twin."""
    if optimizer is None or type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return None
    twin = offloaded.AdamW if type(optimizer) is torch.optim.AdamW else offloaded.Adam
    settings = {key: value for key, value in optimizer.param_groups[0].items()
                if key != "params" and key in optimizer.defaults and key not in ("differentiable", DECOUPLED)}
    return lambda params: twin(params, device_fraction=0.0, **settings)


def _device_update(device: torch.device, dtype: torch.dtype, sizes: list[int],
                   make: MakeOptimizer) -> Callable[[], None]:
    """A step of `make`'s optimizer over parameters of `sizes` elements on `device`."""
    parameters = [torch.nn.Parameter(torch.ones(numel, device=device, dtype=dtype)) for numel in sizes]
    for parameter in parameters:
        parameter.grad = torch.full_like(parameter, 1e-3)
    return make(parameters).step  # type: ignore[no-any-return]


def measure_rates(device: torch.device, dtype: torch.dtype, optimizer: Any = None,
                  numels: list[int] | None = None) -> Any:
    """The update's rates (a _core.UpdateRates, Note [Update rates]): the host's, as parameters
    living on the host are updated, and the device's, as `optimizer` (the factory's: its class and
    flags; torch's AdamW where None) steps there, each probed at the model's typical tensor size
    (`numels`: its parameters'; the probes' largest where not given), not one large buffer: a
    rate from a slope between sizes, not one probe's time over its size, since a fused step's
    fixed cost (the launch: about 0.1 ms on a GPU) would make a GPU's update look several times
    slower than the host's (bench/results/2026-11-26-h200-gpu.md). A device too full for its
    probes is taken as fast as the host."""
    typical = typical_numel(numels) if numels else 1 << 30
    total = sum(numels) if numels else 1 << 30
    host = rates_from(lambda sizes: _host_update(device, dtype, sizes), lambda: None,
                      *probe_shape(typical, total, HOST_PROBE_NUMEL))
    free = memory_cap(device)[0] - int(memory_allocated(device))
    per_parameter = 2 * dtype.itemsize + 2 * 4  # parameter and gradient, fp32 moments
    shape = probe_shape(typical, total, min(DEVICE_PROBE_NUMEL[1], free // DEVICE_PROBE_SHARE // per_parameter))
    make, make_offloaded = probe_optimizer(optimizer), offloaded_probe(optimizer)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        on_device = rates_from(lambda sizes: _device_update(device, dtype, sizes, make), synchronize, *shape)
    except torch.OutOfMemoryError:
        on_device = host
    streamed = (0.0, 0.0)
    if make_offloaded is not None:
        try:
            streamed = rates_from(lambda sizes: _device_update(device, dtype, sizes, make_offloaded), synchronize,
                                  *shape)
        except torch.OutOfMemoryError:  # the offloaded share's step modelled from the host's rates and copies
            pass
    return _core.UpdateRates(host[0], on_device[0], host[1], on_device[1], *streamed)
