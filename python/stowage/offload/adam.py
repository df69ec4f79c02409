"""stowage.offload.Adam and stowage.offload.AdamW: torch.optim.Adam and torch.optim.AdamW with
their states in host memory, updated on the CPU while the GPU goes on. What they do as torch's
would, the update modes, accumulation, DDP, FSDP2, clipping and what they refuse: README's
"Offloading the optimizer"; the bookkeeping's rules: Note [Offloaded optimizer semantics]
(offload/slot_book.hpp) and Note [Whole steps]."""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from stowage import checking
from stowage.byte_counts import byte_count
from stowage.serving import torch_module
from stowage.offload import landing
from stowage.offload.parameters import home_device
from stowage.offload.resident_adam import ResidentUpdate
from stowage.offload.sharded import is_sharded, local, shaped_like
from stowage.warning_site import outside_stowage

UPDATE_MODES = ("exact", "in_backward", "delayed")
DEFAULT_BUCKET_NUMEL = 1 << 24  # 16 M parameters: 448 MB of traffic per update (Note [Optimizer buckets])
# update="exact" streams its buckets through a ring of up to three (Note [Staged buckets]): 4 M parameters
# a bucket bound the ring at 96 MiB for fp32, and make its exposed ends (the first bucket's copy out,
# the last one's write-back) short.
STAGED_BUCKET_NUMEL = 1 << 22
STAGING_SLOTS = torch_module().STAGING_SLOTS  # update="exact"'s staging ring, at most (Note [Staged buckets])
# The offloaded optimizer would need more host memory than the process may use (a MemoryError).
HostMemoryError = torch_module().HostMemoryError


# When a gradient is final, for the offloaded optimizer (Note [Offloaded optimizer semantics]):
# per-parameter hooks, DDP's communication hook, and the end of backward.
#
# ``register_post_accumulate_grad_hook`` fires before DDP has reduced the gradient (ranks would
# update from different gradients and drift apart), so under DDP the gradients are taken from the
# reduced bucket in the communication hook's future instead. DDP copies its buckets into ``.grad``
# in a final callback of its own, queued when its last bucket is ready, after the first hook of
# ours; so ours queues itself once more from its own callback (the engine runs callbacks queued
# while it runs them) and runs after DDP's.
#
# torch 2.11 has no public call for either thing the end of backward needs, so the private ones
# torch's own code uses are used here, and only here: the running graph task's id
# (torch._C._current_graph_task_id, as register_multi_grad_hook and torch.utils.checkpoint read it)
# and a callback queued for the end of backward (Variable._execution_engine.queue_callback, as FSDP2
# queues its own). Likewise Adam reads a parameter's post-accumulate hooks where
# torch keeps them, in order (Tensor._post_accumulate_grad_hooks): no public call lists them.


def weak_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` (a bound method) called through a weak reference to its object: a hook that
    holds it keeps nothing alive, and does nothing (returns None) once the object is gone. Hooks
    registered on a model's parameters live as long as the model; the optimizer must not."""
    ref = weakref.WeakMethod(method)  # type: ignore[arg-type]

    def call(*args: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args)
    return call


class BackwardEnd:
    """Calls `on_end` once at the end of each backward during which arm() was called, after the
    final callbacks already queued (DDP's included); calls `on_abandoned` when a backward that
    armed it never reached its end (it raised) and another begins.
    Contract: arm() from the backward thread; disarm() between backwards."""

    def __init__(self, on_end: Callable[[], None], on_abandoned: Callable[[], None]) -> None:
        self._on_end = on_end
        self._on_abandoned = on_abandoned
        self._armed_task: int | None = None  # the graph task armed for, while it runs

    def arm(self) -> None:
        task = int(torch._C._current_graph_task_id())
        if self._armed_task is not None:
            if self._armed_task == task:
                return
            self._armed_task = None  # the backward armed for raised before its end: this is a new one
            self._on_abandoned()
        engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
        try:
            engine.queue_callback(self._requeue)
        except RuntimeError:
            return  # not inside a backward (a gradient set by hand): step() records versions
        self._armed_task = task

    def disarm(self) -> None:
        """The step took what this backward gave (step() ran): nothing is pending."""
        self._armed_task = None

    def _requeue(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._end)  # type: ignore[attr-defined]

    def _end(self) -> None:
        self._armed_task = None
        self._on_end()


def make_ddp_comm_hook(arrive: Callable[[torch.Tensor, torch.Tensor], None],
                       backward_end: BackwardEnd, process_group: Any) -> Callable[[Any, Any], Any]:
    """A DDP communication hook that averages the bucket like DDP's default (all-reduce, divide
    by the world size) and, once the reduction is done, hands each parameter's reduced gradient
    to `arrive(param, gradient)`."""
    def hook(state: Any, bucket: Any) -> Any:
        backward_end.arm()
        buffer = bucket.buffer()
        buffer.div_(process_group.size() if process_group is not None else dist.get_world_size())
        params = list(bucket.parameters())
        grads = list(bucket.gradients())  # views of the buffer: reduced in place
        future = dist.all_reduce(buffer, group=process_group, async_op=True).get_future()

        def reduced(done: Any) -> torch.Tensor:
            value = done.value()[0]
            for param, grad in zip(params, grads):
                arrive(param, grad)
            return value

        return future.then(reduced)

    # DDP checks a hook's annotations as objects (this module's are strings).
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
    return hook


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C is acted on when the block ends, not inside it (Note [Whole steps]): on the main
    thread Python's SIGINT handler only notes the signal meanwhile, and the C++ waits outlast it
    (InterruptHold); then the handler is put back and, if the signal came, called (ahead of any
    error the block raised, which it then carries as its context)."""
    noted: list[tuple[int, Any]] = []
    previous: Callable[[int, Any], Any] | None = None
    if threading.current_thread() is threading.main_thread():
        current = signal.getsignal(signal.SIGINT)
        if callable(current):  # (not SIG_DFL or SIG_IGN, nor a handler installed outside Python)
            previous = current
            signal.signal(signal.SIGINT, lambda signum, frame: noted.append((signum, frame)))
    try:
        with torch_module().InterruptHold():
            yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
            if noted:
                previous(*noted[0])


def unscaling(grad_scale: torch.Tensor) -> torch.Tensor:
    """What a GradScaler multiplies gradients by to unscale them (its own arithmetic: the
    reciprocal in double, rounded to float32)."""
    return torch.as_tensor(grad_scale).double().reciprocal().float()


class Adam(torch.optim.Optimizer):
    """torch.optim.Adam (its update, options and state_dict) with host-resident states. Contract:
    used from one thread, as torch's optimizers. The bookkeeping is C++'s (adam_slots.hpp): each
    offloaded parameter is a slot numbered in bucket order, ``_params[i]`` its parameter; this
    class observes torch (gradients and local shards at step(); with update="in_backward" or
    "delayed" the post-accumulate hooks and DDP's communication hook too) and hands what it sees to
    the slots.

    A parameter that stowage.offload.parameters keeps on the host when step() runs is updated where
    it lives, in place, by the host kernel (resident_adam.py), whichever part holds its states: a
    slot's states stay in its bucket and the slot sits the step out; the device share's states
    move to the host while the parameter lives there and back to the device with it."""

    _step_supports_amp_scaling = True  # GradScaler hands over grad_scale and found_inf
    _torch_class: type[torch.optim.Optimizer] = torch.optim.Adam

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, *, foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False, update: str = "exact", device_fraction: float = 0.0,
                 bucket_numel: int | None = None, host_memory_limit: int | str | None = None,
                 master_weights: bool = False, overlap: bool = False) -> None:
        if differentiable:
            raise ValueError(f"stowage.offload.{type(self).__name__}: differentiable=True (gradients through the "
                             "update) needs the update in autograd: use torch's optimizer")
        if update not in UPDATE_MODES:
            raise ValueError(f"update must be one of {UPDATE_MODES}, not {update!r}")
        if overlap and update != "exact":
            raise ValueError(f"stowage.offload.{type(self).__name__}: overlap=True runs update='exact''s host part "
                             f"behind the next forward; update={update!r} updates in backward. Use update='exact' "
                             "with overlap=True, or overlap=False.")
        if not 0.0 <= device_fraction <= 1.0:
            raise ValueError(f"device_fraction must lie in [0, 1], not {device_fraction!r}")
        hyper = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, foreach=foreach,
                     maximize=maximize, capturable=capturable, fused=fused)
        if self._torch_class is torch.optim.Adam:
            hyper["decoupled_weight_decay"] = decoupled_weight_decay
        # torch's own checks and group keys, so that state_dicts move between the two.
        defaults = dict(self._torch_class([torch.zeros(1)], **hyper).defaults)  # type: ignore[arg-type]
        super().__init__(params, defaults)  # (its add_param_group calls come before the slots exist)
        self.update_mode = update
        self.device_fraction = device_fraction
        self.master_weights = bool(master_weights)
        self.overlap = bool(overlap)
        self._landing: landing.Landing | None = None  # the overlapped step pending (Note [Overlapped steps])
        self._steps_started = 0
        self._device = self._check_parameters(p for g in self.param_groups for p in g["params"])
        if overlap and any(is_sharded(p) for g in self.param_groups for p in g["params"]):
            raise ValueError(f"stowage.offload.{type(self).__name__}: overlap=True waits for each parameter at its "
                             "first use, and FSDP2's all-gathers read the local shards where no wait is seen. Use "
                             "overlap=False with sharded parameters.")
        # The first parameters up to device_fraction of the count (adam_buckets.hpp's kept_on_device) stay on the
        # device, updated by torch's optimizer.
        pairs = [(p, g) for g in self.param_groups for p in g["params"]]
        kept = pairs[:torch_module().kept_on_device([p.numel() for p, _ in pairs], device_fraction)]
        self._device_group_sources = [g for g in self.param_groups if any(pg is g for _, pg in kept)]
        self._device_optimizer = None if not kept else self._torch_class(  # type: ignore[call-arg]
            [{**{k: v for k, v in g.items() if k != "params"}, "params": [p for p, pg in kept if pg is g]}
             for g in self._device_group_sources])
        bus_id = torch.cuda.get_device_properties(self._device).pci_bus_id if self._device.type == "cuda" else ""
        self._resident = ResidentUpdate(str(self._device), len(torch_module().cpus_near(str(bus_id or ""))),
                                        self._device.type == "cpu")
        self._moved: dict[torch.Tensor, dict[str, Any]] = {}  # the device share's states while on the host
        self._on_host: set[int] = set()  # id() of the parameters living on the host in this step()
        self._slots = torch_module().AdamSlots(
            str(self._device), type(self).__name__, update, torch_module().cpus_near(str(bus_id or "")),
            self.master_weights,
            bucket_numel if bucket_numel is not None else STAGED_BUCKET_NUMEL if update == "exact" else DEFAULT_BUCKET_NUMEL,
            None if host_memory_limit is None else byte_count(host_memory_limit, "host_memory_limit"),
            weak_method(self._slot_name), weak_method(self._at_point))
        self._params: list[torch.Tensor] = []  # by slot number
        self._index: dict[torch.Tensor, int] = {}  # slot number by parameter
        self._waiting: list[tuple[torch.Tensor, dict[str, Any]]] = []  # frozen: no states until a gradient
        self._hooks: list[Any] = []
        self._hook_ids: dict[torch.Tensor, int] = {}  # our post-accumulate hook's, by parameter
        self._backward_end = BackwardEnd(weak_method(self._deferred_arrives), weak_method(self._backward_abandoned))
        checking.apply()
        self._lock = threading.RLock()  # DDP's hook callbacks may run on the process group's threads
        self._accumulating = 0
        self._ddp_attached = False
        self._deferred: torch.Tensor | None = None  # the parameter whose later hooks may still run
        self._warned: set[str] = set()  # the warnings given, each once
        # A test seam: called with the name of each point of step() where a test interrupts it
        # (Note [Whole steps]: "device", "update <bucket>", "write_back <bucket>", "end").
        self._at_step_point: Callable[[str], None] | None = None
        self._offer(pairs[len(kept):])

    # --- construction -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if hasattr(self, "_landing"):
            self._land()
        super().add_param_group(param_group)
        if not hasattr(self, "_slots"):
            return
        group = self.param_groups[-1]
        self._check_parameters(group["params"])
        self._offer([(p, group) for p in group["params"]])

    def _check_parameters(self, params: Iterable[torch.Tensor]) -> torch.device:
        params = list(params)
        # (a parameter stowage.offload.parameters keeps on the host counts as on the device it left)
        devices = {home_device(p) or p.device for p in params} | ({self._device} if hasattr(self, "_device") else set())
        if len(devices) != 1:
            raise ValueError(f"stowage.offload.{type(self).__name__} takes parameters on one device, not "
                             f"{sorted(map(str, devices))}")
        for p in params:
            if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"stowage.offload.{type(self).__name__} updates float32, bfloat16 and float16 "
                                 f"parameters, not {p.dtype}")
        return devices.pop()

    def _offer(self, pairs: list[tuple[torch.Tensor, dict[str, Any]]]) -> None:  # frozen ones wait for a gradient
        self._waiting.extend((p, g) for p, g in pairs if not p.requires_grad)
        self._join([(p, g) for p, g in pairs if p.requires_grad])

    def _join(self, pairs: list[tuple[torch.Tensor, dict[str, Any]]]) -> None:
        """Host states (HostMemoryError when the host has no room), watches and hooks for `pairs`."""
        if not pairs:
            return
        numbers = [next(i for i, g in enumerate(self.param_groups) if g is group) for _, group in pairs]
        joined = [pairs[i][0] for i in self._slots.join([local(p) for p, _ in pairs], numbers,
                                                        [bool(g.get("amsgrad")) for _, g in pairs])]
        ids = {id(p) for p in joined}
        self._waiting = [(p, g) for p, g in self._waiting if id(p) not in ids]
        for param in joined:
            self._index[param] = len(self._params)
            self._params.append(param)
            if param.requires_grad and self.update_mode != "exact":  # exact copies at step() (Note [Staged buckets])
                handle = param.register_post_accumulate_grad_hook(weak_method(self._gradient_accumulated))
                self._hooks.append(handle)
                self._hook_ids[param] = handle.id

    def _slot_name(self, index: int) -> str:
        """'parameter 3 (group 0, shape [64, 24])', after its path in the model where check mode
        knows it ("parameter 'blocks.0.attn.q.weight', parameter 3 (...)")."""
        name = torch_module().describe_parameter(self.param_groups, self._params[index])
        path = checking.parameter_name(self._params[index])
        return f"parameter {path!r}, {name}" if path else name

    def _shards(self) -> list[torch.Tensor]:  # (FSDP2: this rank's)
        return [local(p) for p in self._params]

    def _sync_states(self) -> None:
        """self.state follows the slots: an entry (views of the host states) from a slot's first
        update, none once an undo took its step count back to 0."""
        for index, has_state in self._slots.take_state_changes():
            param = self._params[index]
            if not has_state:
                self.state.pop(param, None)
            elif param not in self.state:
                self.state[param] = self._slots.state_entry(index)

    # --- gradients as they become final -------------------------------------------------------

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[None]:
        """Micro-batches run inside are not the last of the step: nothing is copied out (with
        update="exact" nothing is copied before step() anyway: a marker that changes nothing)."""
        self._accumulating += 1
        try:
            yield
        finally:
            self._accumulating -= 1

    def attach(self, ddp_model: Any) -> None:
        """Takes the gradients after DDP's all-reduce (a communication hook), not before it. With
        update="exact" nothing is needed: step() reads .grad, DDP's reduced gradient, then."""
        if self.update_mode == "exact":
            return
        hook = make_ddp_comm_hook(weak_method(self._arrive), self._backward_end, ddp_model.process_group)
        ddp_model.register_comm_hook(state=None, hook=hook)
        self._ddp_attached = True

    def _gradient_accumulated(self, param: torch.Tensor) -> None:
        """`param`'s gradient is copied once final (Note [Offloaded optimizer semantics])."""
        if self._accumulating or self._ddp_attached or param.grad is None or home_device(param) is not None:
            return  # (a parameter on the host is updated at step(), where it lives)
        self._backward_end.arm()
        self._deferred_arrives()
        # Hooks registered after ours still to run on `param` (torch keeps them in order; where it
        # does not say, assumed): its copy waits.
        hooks = getattr(param, "_post_accumulate_grad_hooks", None)
        if not hooks or next(reversed(hooks)) != self._hook_ids.get(param):
            self._deferred = param
        else:
            self._arrive(param, param.grad)

    def _arrive(self, param: torch.Tensor, gradient: torch.Tensor) -> None:
        if self._accumulating:
            return
        index = self._index.get(param)
        if index is None:
            return  # kept on the device
        with self._lock:
            ready = self._slots.arrive(index, gradient, local(gradient))
            if ready == -2:  # in_backward: its bucket was already updated from the first
                self._undo_provisional()
                raise RuntimeError(
                    f"stowage.offload.{type(self).__name__}(update='in_backward'): a gradient arrived twice in one "
                    "step, and its bucket was already updated from the first: a second backward before step() "
                    "(gradient accumulation that is not marked). Run the micro-batches before the last inside "
                    "optimizer.accumulating() (or DDP's no_sync()), or use update='exact'. Nothing was applied.")
            if self.update_mode == "in_backward":
                if not self._slots.parameters_checked:  # parameters written since (a loaded checkpoint, ...)
                    self._slots.set_parameters_checked()
                    self._slots.take_written(list(range(len(self._params))), self._shards())
                if ready >= 0:
                    self._slots.submit(ready, self.param_groups[self._slots.group_of(ready)], 1.0)
                    self._sync_states()

    def _deferred_arrives(self) -> None:  # (the next hook came, or the backward ended)
        deferred, self._deferred = self._deferred, None
        if deferred is not None and deferred.grad is not None:  # (a hook may have dropped it)
            self._arrive(deferred, deferred.grad)

    def _backward_abandoned(self) -> None:
        """A backward that copied gradients (and, in_backward, updated buckets) raised, or zero_grad()
        drops them: the arrivals and provisional updates go."""
        self._deferred = None
        with self._lock:
            self._undo_provisional()
            self._slots.reset_arrivals()

    # --- clipping and loss scaling ------------------------------------------------------------

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over this optimizer's gradients, without a pass over the
        offloaded ones: their coefficient is applied as the host update reads them. Returns the
        total norm."""
        self._land()
        if self.update_mode == "in_backward":
            # Buckets updated in backward before the norm existed are undone; step() updates every
            # bucket with the coefficient, exactly, as "exact" would.
            self._undo_provisional()
            self._warn_once(f"stowage.offload.{type(self).__name__}(update='in_backward'): clip_grad_norm_ undoes "
                            "the updates made during backward and step() makes them again with the clipping "
                            "coefficient; update='exact' clips without that work.")
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite)
        if is_sharded(total):
            total = total.full_tensor()  # FSDP2: the norm over every rank's shards
        coefficient = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        # The device share is clipped where it is; every other gradient (offloaded, or a frozen
        # parameter's that joins at step()) takes the coefficient in the host update.
        # Gradients on the host whose parameter lives there are clipped in place, as torch's clip does.
        kept = [local(p.grad) for p in self._device_parameters() if p.grad is not None]
        kept += [p.grad for p in self._params if p.grad is not None and home_device(p) is not None]
        for device in {g.device for g in kept}:
            torch._foreach_mul_([g for g in kept if g.device == device], coefficient.to(device))
        self._slots.clip_by(coefficient)
        return total

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, stacklevel=outside_stowage())

    def _device_parameters(self) -> list[torch.Tensor]:
        inner = self._device_optimizer
        return [] if inner is None else [p for g in inner.param_groups for p in g["params"]]

    # --- the step (Note [Whole steps]: all or nothing) -----------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        self._land()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with interrupts_held():  # Ctrl-C is acted on once the step is whole
            self._deferred = None  # (not copied in backward: collected below as any late gradient)
            self._on_host = self._living_on_host()
            try:
                if not self._prepare_step():
                    return loss
            finally:
                self._sync_states()
            try:
                with self._lock:
                    conflict = landing.mode_conflict() if self.overlap else None
                    if conflict is not None:
                        self._warn_once(f"stowage.offload.{type(self).__name__}(overlap=True): {conflict}, whose exit "
                                        "would take off the mode that makes the loop wait for the pending step; "
                                        "this step() ran its host part before returning. Call step() outside the "
                                        "mode to overlap it.")
                    if self.overlap and conflict is None:
                        self._start_overlapped()
                    else:
                        self._slots.commit_step(*self._step_inputs())
            finally:
                if self._landing is None:
                    self._sync_states()
                self._backward_end.disarm()
        return loss

    def _start_overlapped(self) -> None:
        """The host part started behind the loop (Note [Overlapped steps]): what it reads and writes
        (each updated parameter, its gradient, its state tensors) waits for its bucket until landed."""
        inputs = self._step_inputs()
        waiting: dict[int, list[torch.Tensor]] = {}
        for index, (param, grad) in enumerate(zip(self._params, inputs[0])):
            if grad is None:
                continue
            if param not in self.state:  # (its first update is this step's: the entry shows it once landed)
                self.state[param] = self._slots.state_entry(index)
            states = [v for v in self.state[param].values() if isinstance(v, torch.Tensor)]
            waiting.setdefault(self._slots.bucket_of(index), []).extend([param, grad, *states])
        self._steps_started += 1
        step = torch_module().OverlappedStep(self._slots, str(self._device), *inputs)
        self._landing = landing.Landing(step, type(self).__name__, self._steps_started, waiting)
        landing.begin(self._landing)

    def _land(self) -> None:
        """Finishes the overlapped step pending, if any: its error, if no wait raised it yet, is
        raised here, after the step was finished whole."""
        pending, self._landing = self._landing, None
        if pending is None:
            return
        try:
            pending.finish()
        finally:
            landing.end(pending)
            self._sync_states()

    def _living_on_host(self) -> set[int]:
        """id() of the trained parameters stowage.offload.parameters keeps on the host now; refused,
        before anything changes, where the update mode updates in backward (its copies expect the
        parameters on the device)."""
        found = {id(p) for g in self.param_groups for p in g["params"]
                 if p.requires_grad and home_device(p) is not None}
        if found and self.update_mode != "exact":
            raise ValueError(
                f"stowage.offload.{type(self).__name__}(update={self.update_mode!r}): {len(found)} parameters live on "
                "the host (stowage.offload.parameters), where step() updates them in place; updates made during "
                "backward copy parameters from the device. Use update='exact' (the default). Nothing was applied.")
        return found

    def _step_inputs(self) -> tuple[Any, ...]:  # AdamSlots::StepInputs
        # A parameter living on the host sits the slots' step out: the host-resident part updates it.
        grads = [None if id(p) in self._on_host else p.grad for p in self._params]
        found_inf, grad_scale = getattr(self, "found_inf", None), getattr(self, "grad_scale", None)
        return (grads, [None if g is None else local(g) for g in grads], self._shards(), self.param_groups,
                1.0 if grad_scale is None else float(grad_scale), found_inf is not None,
                found_inf is not None and float(found_inf) > 0)

    def _prepare_step(self) -> bool:
        """AdamSlots::prepare_step, then the device share's update; False: the step is skipped. An
        error leaves nothing applied (provisional updates undone, the arrivals kept)."""
        try:
            self._join([(p, g) for p, g in self._waiting if p.grad is not None])  # unfrozen: states start now
            with self._lock:
                skipped, messages = self._slots.prepare_step(*self._step_inputs())
            for message in messages:
                self._warn_once(message)
            if skipped:
                self._backward_end.disarm()
                return False
            self._move_device_states()  # (where their parameters live now; no value changes)
            on_host = self._host_work()  # checked, with their states, before the device share's step changes anything
            self._at_point("device")
            self._step_on_device()
            self._step_on_host(on_host)
        except BaseException:
            self._undo_provisional()
            raise
        return True

    def _at_point(self, name: str) -> None:
        if self._at_step_point is not None:
            self._at_step_point(name)

    def _step_on_device(self) -> None:
        inner = self._device_optimizer
        if inner is None:
            return
        for ours, theirs in zip(self._device_group_sources, inner.param_groups):
            theirs.update({k: v for k, v in ours.items() if k != "params"})
        # torch's optimizer skips a parameter without a gradient: those living on the host lend theirs
        # to the host-resident part for its step.
        lent = {p: p.grad for p in self._device_parameters() if id(p) in self._on_host}
        if getattr(inner, "_step_supports_amp_scaling", False):  # (fused) it unscales as it updates
            for name in ("grad_scale", "found_inf"):
                if getattr(self, name, None) is not None:
                    setattr(inner, name, getattr(self, name))
        elif getattr(self, "grad_scale", None) is not None:  # unscaled as GradScaler unscales for it
            grads = [local(p.grad) for p in self._device_parameters() if p.grad is not None and p not in lent]
            for device in {g.device for g in grads}:
                torch._foreach_mul_([g for g in grads if g.device == device], unscaling(self.grad_scale).to(device))
        try:
            for param in lent:
                param.grad = None
            inner.step()
        finally:
            for param, grad in lent.items():
                param.grad = grad
            for name in ("grad_scale", "found_inf"):
                if hasattr(inner, name):
                    delattr(inner, name)
        self.state.update({p: inner.state[p] for p in self._device_parameters() if p in inner.state})

    def _move_device_states(self) -> None:
        """The device share's states go where their parameter lives now: to the host with it, back to
        the device once it is back (the step count where torch keeps it: on the device for a fused or
        capturable step, else on the CPU)."""
        inner = self._device_optimizer
        if inner is None:
            return
        for param in self._device_parameters():
            if id(param) in self._on_host and param in inner.state:
                self._moved[param] = self._resident.to_host(inner.state[param])
                del inner.state[param]
                self.state[param] = self._moved[param]
            elif id(param) not in self._on_host and param in self._moved:
                group = next(g for g in inner.param_groups if any(p is param for p in g["params"]))
                step_on_device = bool(group.get("fused") or group.get("capturable"))  # where torch keeps it
                inner.state[param] = self._resident.to_device(self._moved.pop(param), param.device, step_on_device)
                self.state[param] = inner.state[param]

    def _host_work(self) -> list[tuple[torch.Tensor, dict[str, Any], dict[str, Any]]]:
        """The parameters living on the host with a gradient, their groups and host states (made
        where they have none yet); refused (nothing applied) where one cannot be updated in place."""
        work = [(p, g) for g in self.param_groups for p in g["params"] if id(p) in self._on_host and p.grad is not None]
        for param, _ in work:
            why = self._resident.refusal(param.data, param.grad)
            if why:
                raise ValueError(f"stowage.offload.{type(self).__name__}: {self._describe(param)} lives on the host "
                                 f"(stowage.offload.parameters), where step() updates it in place, but {why}. "
                                 "Nothing was applied.")
        return [(param, group, self._resident_entry(param, group)) for param, group in work]

    def _step_on_host(self, work: list[tuple[torch.Tensor, dict[str, Any], dict[str, Any]]]) -> None:
        """Each of `work` (_host_work) updated in place by the host kernel."""
        grad_scale = getattr(self, "grad_scale", None)
        scale = 1.0 if grad_scale is None else float(unscaling(grad_scale))
        for param, group, entry in work:
            self._resident.update(param.data, param.grad.contiguous(), entry, group, scale)
            self.state[param] = entry
            if param in self._index and "master" in entry:  # the slot's master wrote the parameter
                self._slots.parameters_are([self._index[param]], [param.data])

    def _resident_entry(self, param: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """The host states the update of `param` reads: its slot's, or the device share's (moved),
        or fresh ones at its first step."""
        index = self._index.get(param)
        if index is not None:
            return self._slots.state_entry(index)
        if param not in self._moved:
            self._moved[param] = self._resident.fresh_states(param, bool(group.get("amsgrad")))
        return self._moved[param]

    def _describe(self, param: torch.Tensor) -> str:
        return torch_module().describe_parameter(self.param_groups, param)

    def _undo_provisional(self) -> None:
        """in_backward's updates made during a backward whose step() has not come are undone."""
        with self._lock, interrupts_held():
            self._slots.roll_back()
            self._sync_states()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad; without a step() since the last backward, that backward's gradients
        (and, in_backward, its provisional updates) are dropped as torch's would be. While an
        overlapped step is pending it does not wait for it: that step took the only arrivals there
        were (update="exact" has none outside step()) and holds the gradients it has not copied out
        yet, so dropping them waits for nothing, and zeroing them in place waits for their bucket
        (Note [Overlapped steps])."""
        if self._landing is None or self._landing.ended():
            self._land()
            self._backward_abandoned()
        self._backward_end.disarm()
        super().zero_grad(set_to_none)

    # --- checkpoints and the end --------------------------------------------------------------

    def flush(self) -> None:
        """Makes the states and parameters those of the last step() (AdamSlots::flush), so that a
        state_dict taken between backward and step() pairs the states with their parameters; an
        overlapped step pending is finished first."""
        self._land()
        with self._lock, interrupts_held():
            try:
                self._slots.flush(self._shards())
            finally:
                self._sync_states()

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        saved = super().state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        for index, entry in saved["state"].items():
            param = params[index]
            if param in self._index and is_sharded(param):  # FSDP2: sharded like the parameter
                saved["state"][index] = {k: (v if k == "step" else shaped_like(v, param)) for k, v in entry.items()}
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load_state_dict, checked whole before anything changes: a bad entry is refused
        naming the parameter and the field (Note [Offloaded optimizer state_dict],
        python/bindings/torch/adam_state_check.cpp)."""
        self._land()
        by_param = torch_module().check_adam_state(self.param_groups, state_dict, type(self).__name__, local)
        self.flush()
        for ours, saved in zip(self.param_groups, state_dict["param_groups"]):
            ours.update({k: v for k, v in saved.items() if k != "params"})
        self._join([(p, g) for p, g in self._waiting if by_param.get(p)])
        entries = self._slots.load([by_param.get(p) for p in self._params], self._shards(), local)
        for param, entry in zip(self._params, entries):
            if entry is None:
                self.state.pop(param, None)
            else:
                self.state[param] = entry
        if self._device_optimizer is not None:
            self._moved.clear()  # (the loaded states move to the host at the next step(), where needed)
            inner_state = torch_module().split_device_state(self._device_optimizer.param_groups, by_param)
            self._device_optimizer.load_state_dict(inner_state)
            inner = self._device_optimizer.state
            self.state.update({p: inner[p] for p in self._device_parameters() if p in inner})

    def host_stats(self) -> dict[str, Any]:
        """The host memory the states take (bytes, staging_bytes of them update="exact"'s staging
        ring; pinned_bytes and pageable_bytes are the device's pinned pool's, shared with offloaded
        activations), its placement, the updating CPUs, and the seconds spent in host updates and
        in comparing parameters' and gradients' bytes."""
        self._land()
        return self._slots.host_stats()

    def close(self) -> None:
        """Finishes pending updates and copies and lets go of the hooks."""
        self.flush()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


class AdamW(Adam):
    """torch.optim.AdamW (decoupled weight decay) with host-resident states: Adam's keyword
    options (update=, device_fraction=, ...), torch's AdamW defaults."""

    _torch_class = torch.optim.AdamW

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, **options: Any) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, decoupled_weight_decay=True, **options)
