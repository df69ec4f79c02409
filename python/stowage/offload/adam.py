"""stowage.offload.Adam and stowage.offload.AdamW: torch.optim.Adam and torch.optim.AdamW with
their fp32 master weights and moments in host memory, updated on the CPU while the GPU goes on.

    optimizer = stowage.offload.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    for batch in data:
        loss_of(model, batch).backward()   # gradients are copied out as they become final
        optimizer.step()                   # the host update; parameters stream back
        optimizer.zero_grad()

Each gradient is copied to pinned host memory as soon as it is final (grouped in buckets); the
update runs in one pass over the host states (the C++ kernel, torch's update with every option:
Adam's L2 penalty or AdamW's decoupled decay, ``maximize``, ``amsgrad``); updated parameters
stream back on a copy stream. The states are those torch's optimizer would keep: fp32 for fp32
parameters, the parameter's own precision for bf16 and fp16 ones (torch's Adam keeps bf16
moments for a bf16 parameter). ``master_weights=True`` keeps fp32 masters and moments for bf16 /
fp16 parameters instead (the mixed-precision recipe, 16 host bytes a parameter instead of 8):
more exact than torch's optimizer on those parameters, so not what it computes.

What torch's optimizer would do, this one does (Note [Offloaded optimizer semantics]):
- a parameter is updated if and only if its ``.grad`` is not None at step(); frozen parameters
  (``requires_grad=False``) take no hook and no host memory until they have a gradient, then join;
- the gradient used is the one present at step(), whoever changed it: a gradient is copied out
  once every post-accumulate hook of its parameter has run (those registered after the
  optimizer's included), and one replaced (``p.grad = ...``) or written after that (clipping,
  unscaling, ``p.grad.data.clamp_()``) is copied again (its bytes are compared with a checksum
  taken as it was copied; check mode compares them bit for bit);
- the options used are the param group's at step() (a scheduler stepped, or lr set, after
  backward);
- a write to a parameter between steps wins, ``p.data.clamp_()`` and ``p.data.copy_()`` included
  (they leave no trace in the version counter: the parameters' bytes are compared on the device,
  python/bindings/torch/content_watch.hpp), and the write becomes the master weights;
- a backward that raises leaves nothing applied; sparse gradients and bad state_dicts are refused
  at first sight, naming the parameter or the field;
- a step() is all or nothing (Note [Whole steps]): Ctrl-C is acted on once the step is whole, and an
  error leaves parameters and states both as before the step or both as after it.

When the update runs (``update=``):
- ``"exact"`` (default): in step(), once gradient clipping and the GradScaler's inf check are
  known, bucket after bucket, each bucket's write-back overlapping the next one's update. The
  copies out overlap backward; the update itself does not (it adds its time to the step).
- ``"in_backward"``: a bucket is updated as soon as its gradients have arrived, hidden behind
  the rest of backward; the update is provisional until step() (zero_grad() without step(), or a
  backward that raises, undoes it: host copies of the states, 12-16 bytes a parameter). Exact
  only when nothing changes the gradients after backward: step() raises if a GradScaler,
  ``clip_grad_norm_`` or anything else did, or replaced or dropped one; and a second backward
  before step() is refused unless its micro-batches are marked (``accumulating()``). Options
  changed between backward and step() (a scheduler's step) are honoured: the updates made with
  the old ones are undone and made again in step() (warned once: that work is done twice).
- ``"delayed"``: step() hands this step's update to the host and returns; its parameters are
  written back at the next step(), so forward and backward run on parameters one update behind
  (ZeRO-Offload's delayed parameter update): hides the update fully, and changes the numerics.
  A write to parameters between steps replaces their masters, and the update still pending for
  them is dropped (their moments keep it).

Gradient accumulation: run the micro-batches before the last inside ``optimizer.accumulating()``
(gradients are not final there, so nothing is copied); unmarked, ``"exact"`` copies them again
at step(). Under DDP, call ``optimizer.attach(ddp)``: the gradients are then taken after DDP's
all-reduce, and DDP's own ``no_sync()`` marks the micro-batches. Under FSDP2 (``fully_shard``)
nothing is needed: FSDP2 calls the hooks after each reduce-scatter, and each rank holds and
updates only its shards (states are DTensors in state_dict, sharded like the parameters).
Clipping: ``optimizer.clip_grad_norm_(max_norm)`` folds the coefficient into the update;
``torch.nn.utils.clip_grad_norm_`` also works, at the cost of copying every gradient again in
step(). A GradScaler's inf check skips the step with nothing applied.

``device_fraction``: the share of parameters (by count; the first ones, whose gradients arrive
last in backward) whose states stay on the device, updated there by torch's own optimizer with
the options given (bitwise torch's). ``state_dict()`` is torch's format; with master_weights,
parameters that are not fp32 add their fp32 masters under ``"master"``. Not supported:
``differentiable=True``, parameters on several devices.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator

import torch

from stowage import checking
from stowage.byte_counts import byte_count
from stowage.serving import torch_module
from stowage.offload.adam_buckets import DEFAULT_BUCKET_NUMEL, kept_on_device
from stowage.offload.gradient_arrival import BackwardEnd, make_ddp_comm_hook, weak_method
from stowage.offload.host_memory import check_host_room
from stowage.offload.sharded import is_sharded, local, shaped_like
from stowage.offload.whole_steps import interrupts_held, run_whole
from stowage.warning_site import outside_stowage

UPDATE_MODES = ("exact", "in_backward", "delayed")


class Adam(torch.optim.Optimizer):
    """torch.optim.Adam (its update, options and state_dict) with host-resident states; see the
    module's documentation. Contract: used from one thread, as torch's optimizers.

    The bookkeeping is C++'s (python/bindings/torch/adam_slots.hpp, Note [Offloaded optimizer
    semantics] in offload/slot_book.hpp): each offloaded parameter is a slot numbered in bucket
    order, ``_params[i]`` its parameter; this class observes torch (hooks, gradients, parameters'
    local shards) and hands what it sees to the slots."""

    _step_supports_amp_scaling = True  # GradScaler hands over grad_scale and found_inf
    _torch_class: type[torch.optim.Optimizer] = torch.optim.Adam

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, *, foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False, update: str = "exact", device_fraction: float = 0.0,
                 bucket_numel: int = DEFAULT_BUCKET_NUMEL, host_memory_limit: int | str | None = None,
                 master_weights: bool = False) -> None:
        if differentiable:
            raise ValueError(f"stowage.offload.{type(self).__name__}: differentiable=True (gradients through the "
                             "update) needs the update in autograd: use torch's optimizer")
        if update not in UPDATE_MODES:
            raise ValueError(f"update must be one of {UPDATE_MODES}, not {update!r}")
        if not 0.0 <= device_fraction <= 1.0:
            raise ValueError(f"device_fraction must lie in [0, 1], not {device_fraction!r}")
        if bucket_numel < 1:
            raise ValueError(f"bucket_numel must be positive, not {bucket_numel!r}")
        hyper = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, foreach=foreach,
                     maximize=maximize, capturable=capturable, fused=fused)
        if self._torch_class is torch.optim.Adam:
            hyper["decoupled_weight_decay"] = decoupled_weight_decay
        # torch's own checks and group keys, so that state_dicts move between the two.
        defaults = dict(self._torch_class([torch.zeros(1)], **hyper).defaults)  # type: ignore[arg-type]
        self._constructing = True
        super().__init__(params, defaults)
        self._constructing = False
        self.update_mode = update
        self.device_fraction = device_fraction
        self.master_weights = bool(master_weights)
        self._limit = None if host_memory_limit is None else byte_count(host_memory_limit, "host_memory_limit")
        self._device = self._check_parameters(p for g in self.param_groups for p in g["params"])
        offloaded, kept = self._split_by_fraction(device_fraction)
        self._device_group_sources: list[dict[str, Any]] = []
        self._device_optimizer = self._make_device_optimizer(kept)
        self._slots = torch_module().AdamSlots(
            str(self._device), type(self).__name__, update, torch_module().cpus_near(self._store_bus_id() or ""),
            self.master_weights, bucket_numel, weak_method(self._slot_name))
        self._params: list[torch.Tensor] = []  # by slot number
        self._index: dict[torch.Tensor, int] = {}  # slot number by parameter
        self._groups: list[dict[str, Any]] = []  # by the group numbers the slots hold
        self._waiting: list[tuple[torch.Tensor, dict[str, Any]]] = []  # frozen: no states until a gradient
        self._hooks: list[Any] = []
        self._hook_ids: dict[torch.Tensor, int] = {}  # our post-accumulate hook's, by parameter
        self._backward_end = BackwardEnd(weak_method(self._backward_ended), weak_method(self._backward_abandoned))
        checking.apply()
        self._lock = threading.Lock()  # DDP's hook callbacks may run on the process group's threads
        self._accumulating = 0
        self._ddp_attached = False
        self._clip_coefficient: torch.Tensor | None = None
        self._deferred: torch.Tensor | None = None  # the parameter whose later hooks may still run
        self._warned_recopy = False
        self._warned_clip = False
        self._warned_options = False
        # A test seam: called with the name of each point of step() where a test interrupts it
        # (Note [Whole steps]: "device", "update <bucket>", "write_back <bucket>", "end").
        self._at_step_point: Callable[[str], None] | None = None
        self._offer(offloaded)

    # --- construction -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if getattr(self, "_constructing", True):
            return
        group = self.param_groups[-1]
        self._check_parameters(group["params"])
        self._offer([(p, group) for p in group["params"]])

    def _check_parameters(self, params: Iterable[torch.Tensor]) -> torch.device:
        params = list(params)
        devices = {p.device for p in params} | ({self._device} if hasattr(self, "_device") else set())
        if len(devices) != 1:
            raise ValueError(f"stowage.offload.{type(self).__name__} takes parameters on one device, not "
                             f"{sorted(map(str, devices))}")
        for p in params:
            if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(f"stowage.offload.{type(self).__name__} updates float32, bfloat16 and float16 "
                                 f"parameters, not {p.dtype}")
        return devices.pop()

    def _split_by_fraction(self, fraction: float) -> tuple[list[tuple[torch.Tensor, dict[str, Any]]],
                                                           list[tuple[torch.Tensor, dict[str, Any]]]]:
        """(offloaded, kept on the device): the first parameters up to `fraction` of the count stay
        (adam_buckets.kept_on_device, which fit's accounting uses too)."""
        pairs = [(p, g) for g in self.param_groups for p in g["params"]]
        kept = kept_on_device([p.numel() for p, _ in pairs], fraction)
        return pairs[kept:], pairs[:kept]

    def _make_device_optimizer(self, kept: list[tuple[torch.Tensor, dict[str, Any]]]) -> torch.optim.Optimizer | None:
        """torch's own optimizer, with the options given, for the parameters kept on the device."""
        if not kept:
            return None
        sources = [g for g in self.param_groups if any(pg is g for _, pg in kept)]
        self._device_group_sources = sources  # our group behind each of the inner optimizer's
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [p for p, pg in kept if pg is g]}
                  for g in sources]
        return self._torch_class(groups)  # type: ignore[call-arg]

    def _store_bus_id(self) -> str | None:
        if self._device.type != "cuda":
            return None
        return str(torch.cuda.get_device_properties(self._device).pci_bus_id) or None

    def _offer(self, pairs: list[tuple[torch.Tensor, dict[str, Any]]]) -> None:
        """Lays out host states for the parameters that train; the frozen ones wait."""
        self._waiting.extend((p, g) for p, g in pairs if not p.requires_grad)
        self._join([(p, g) for p, g in pairs if p.requires_grad])

    def _join(self, pairs: list[tuple[torch.Tensor, dict[str, Any]]]) -> None:
        """Host states (after checking the host has room for them), watches and hooks for `pairs`
        (parameters offloaded from now on); the masters start from the parameters."""
        if not pairs:
            return
        for _, group in pairs:
            if not any(g is group for g in self._groups):
                self._groups.append(group)
        shards = [local(p) for p, _ in pairs]
        numbers = [next(i for i, g in enumerate(self._groups) if g is group) for _, group in pairs]
        amsgrad = [bool(g.get("amsgrad")) for _, g in pairs]
        limit = None if self._limit is None else self._limit - self._slots.allocated_bytes
        check_host_room(self._slots.host_bytes(shards, numbers, amsgrad), "stowage.offload.AdamW's host states",
                        limit)
        joined = [pairs[i][0] for i in self._slots.join(shards, numbers, amsgrad)]
        for param in joined:
            self._index[param] = len(self._params)
            self._params.append(param)
        ids = {id(p) for p in joined}
        self._waiting = [(p, g) for p, g in self._waiting if id(p) not in ids]
        for param in joined:
            if param.requires_grad:
                handle = param.register_post_accumulate_grad_hook(weak_method(self._gradient_accumulated))
                self._hooks.append(handle)
                self._hook_ids[param] = handle.id

    def _join_waiting(self) -> None:
        """Frozen parameters that now have a gradient (unfrozen) join, as torch's optimizer would
        start their states at their first step."""
        self._join([(p, g) for p, g in self._waiting if p.grad is not None])

    def _slot_name(self, index: int) -> str:
        """'parameter 3 (group 0, shape [64, 24])'"""
        return torch_module().describe_parameter(self.param_groups, self._params[index])

    def _checked_name(self, index: int) -> str:
        """The slot's name in check mode's messages: its path in the model first, where known."""
        name = checking.parameter_name(self._params[index])
        return f"parameter {name!r}, {self._slot_name(index)}" if name else self._slot_name(index)

    def _shards(self, slots: Iterable[int] | None = None) -> list[torch.Tensor]:
        """The local shards (FSDP2) of the slots' parameters as they are now (all by default)."""
        params = self._params if slots is None else [self._params[i] for i in slots]
        return [local(p) for p in params]

    def _gradients(self) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Each slot's gradient now, and its local shard."""
        grads = [p.grad for p in self._params]
        return grads, [None if g is None else local(g) for g in grads]

    # --- gradients as they become final -------------------------------------------------------

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[None]:
        """Micro-batches run inside are not the last of the step: their gradients are not final
        and nothing is copied out."""
        self._accumulating += 1
        try:
            yield
        finally:
            self._accumulating -= 1

    def attach(self, ddp_model: Any) -> None:
        """Takes the gradients after DDP's all-reduce (a communication hook), not before it."""
        hook = make_ddp_comm_hook(weak_method(self._arrive), self._backward_end, ddp_model.process_group)
        ddp_model.register_comm_hook(state=None, hook=hook)
        self._ddp_attached = True

    def _gradient_accumulated(self, param: torch.Tensor) -> None:
        """`param`'s gradient is copied now, or, when hooks registered after this one have yet to
        run on it, when the next parameter's gradient arrives (the engine runs each parameter's
        hooks together) or at the end of backward (Note [Offloaded optimizer semantics])."""
        if self._accumulating or self._ddp_attached or param.grad is None:
            return
        self._backward_end.arm()
        previous, self._deferred = self._deferred, None
        if previous is not None and previous.grad is not None:  # (a hook may have dropped it)
            self._arrive(previous, previous.grad)
        if self._hooks_follow(param):
            self._deferred = param
        else:
            self._arrive(param, param.grad)

    def _hooks_follow(self, param: torch.Tensor) -> bool:
        """Whether post-accumulate hooks registered after ours are on `param` (torch keeps them
        in order; where it does not say, assumed)."""
        hooks = getattr(param, "_post_accumulate_grad_hooks", None)
        if not hooks:
            return True
        return next(reversed(hooks)) != self._hook_ids.get(param)

    def _arrive(self, param: torch.Tensor, gradient: torch.Tensor) -> None:
        if self._accumulating:
            return
        index = self._index.get(param)
        if index is None:
            return  # kept on the device
        with self._lock:
            ready = self._slots.arrive(index, gradient, local(gradient))
            if ready == -2:  # in_backward: its bucket was already updated from the first
                self._roll_back()
                raise RuntimeError(
                    f"stowage.offload.{type(self).__name__}(update='in_backward'): a gradient arrived twice in one "
                    "step, and its bucket was already updated from the first: a second backward before step() "
                    "(gradient accumulation that is not marked). Run the micro-batches before the last inside "
                    "optimizer.accumulating() (or DDP's no_sync()), or use update='exact'. Nothing was applied.")
            if self.update_mode == "in_backward":
                if not self._slots.parameters_checked:
                    self._slots.set_parameters_checked()
                    self._take_written_parameters(range(len(self._params)))
                if ready >= 0:
                    self._submit(ready, 1.0)

    def _backward_ended(self) -> None:
        """Every hook has run: the gradient whose copy waited for its hooks is final."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None and deferred.grad is not None:  # (a hook may have dropped it)
            self._arrive(deferred, deferred.grad)

    def _backward_abandoned(self) -> None:
        """A backward that copied gradients (and, in_backward, updated buckets) raised: nothing of
        it may count."""
        self._deferred = None
        with self._lock:
            self._roll_back()
            self._slots.reset_arrivals()

    # --- parameters written by someone else ---------------------------------------------------

    def _take_written_parameters(self, slots: Iterable[int]) -> None:
        """Parameters whose bytes changed since their last write-back (``.data`` writes, a loaded
        checkpoint, DDP's broadcast) become the masters (and the outputs a delayed write-back
        would send)."""
        slots = list(slots)
        self._slots.take_written(slots, self._shards(slots))

    # --- clipping and loss scaling ------------------------------------------------------------

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over this optimizer's gradients, without a pass over the
        offloaded ones: their coefficient is applied as the host update reads them. Returns the
        total norm."""
        if self.update_mode == "in_backward":
            self._clip_in_backward()
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite)
        if is_sharded(total):
            total = total.full_tensor()  # FSDP2: the norm over every rank's shards
        coefficient = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        # The device share is clipped where it is; every other gradient (offloaded, or a frozen
        # parameter's that joins at step()) takes the coefficient in the host update.
        kept = [local(p.grad) for p in self._device_parameters() if p.grad is not None]
        if kept:
            torch._foreach_mul_(kept, coefficient.to(kept[0].device))
        self._clip_coefficient = coefficient if self._clip_coefficient is None else self._clip_coefficient * coefficient
        return total

    def _clip_in_backward(self) -> None:
        """in_backward updated buckets before the norm over all gradients existed: those updates
        are undone, and step() updates every bucket with the clipping coefficient, exactly, as
        "exact" would (the work backward did is done again: use update='exact' to clip)."""
        self._undo_provisional()
        if not self._warned_clip:
            self._warned_clip = True
            warnings.warn(f"stowage.offload.{type(self).__name__}(update='in_backward'): clip_grad_norm_ undoes the "
                          "updates made during backward and step() makes them again with the clipping "
                          "coefficient; update='exact' clips without that work.", stacklevel=outside_stowage())

    def _device_parameters(self) -> list[torch.Tensor]:
        if self._device_optimizer is None:
            return []
        return [p for g in self._device_optimizer.param_groups for p in g["params"]]

    def _gradient_scale(self) -> tuple[float, bool]:
        """(the factor the host update applies to the gradients, whether to skip the step)."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and float(found_inf) > 0:
            return 1.0, True
        scale = 1.0
        grad_scale = getattr(self, "grad_scale", None)
        if grad_scale is not None:
            scale /= float(grad_scale)
        if self._clip_coefficient is not None:
            scale *= float(self._clip_coefficient)
        return scale, False

    # --- the step (Note [Whole steps]: all or nothing) -----------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with interrupts_held():  # Ctrl-C is acted on once the step is whole
            self._deferred = None  # (not copied in backward: collected below as any late gradient)
            scale = self._prepare_step()
            if scale is not None:
                self._commit_step(scale)
        return loss

    def _prepare_step(self) -> float | None:
        """What comes before the host states change: the checks, the gradients and parameters
        taken, and last the states kept on the device updated by torch's optimizer. Returns the
        gradients' scale (None: the step is skipped). An error here leaves nothing of the step
        applied on the host (in_backward's provisional updates undone, the arrivals kept: step()
        may be called again)."""
        try:
            self._join_waiting()
            scale, skip = self._gradient_scale()
            if self.update_mode == "delayed":
                self._slots.finish_pending()
            self._take_parameters_for_step()
            if self.update_mode == "in_backward":
                self._check_in_backward_exact(scale)
                self._redo_outdated_updates()
            if self.update_mode == "delayed":
                self._write_back_pending()
            if skip:
                self._discard_step()
                return None
            self._collect_gradients()
            self._slots.check_options(self._groups)
            self._at_point("device")
            self._step_on_device()
        except BaseException:
            self._undo_provisional()  # the arrivals stay: step() may be called again
            raise
        return scale

    def _commit_step(self, scale: float) -> None:
        """The host part, finished whatever is raised in it (the first error raised after):
        each bucket's update, then (not delayed) each bucket's write-back, then the end."""
        buckets = range(self._slots.bucket_count)
        written: list[int] = []
        parts: list[Callable[[], None]] = [functools.partial(self._submit_for_step, b, scale) for b in buckets]
        if self.update_mode != "delayed":
            parts += [functools.partial(self._write_back_for_step, b, written) for b in buckets]
        parts.append(self._finish_step)
        run_whole(parts)
        self._check_arrivals(written)

    def _at_point(self, name: str) -> None:
        if self._at_step_point is not None:
            self._at_step_point(name)

    def _submit_for_step(self, bucket: int, scale: float) -> None:
        self._at_point(f"update {bucket}")
        with self._lock:
            if not self._slots.updated(bucket):
                self._submit(bucket, scale)

    def _write_back_for_step(self, bucket: int, written: list[int]) -> None:
        self._at_point(f"write_back {bucket}")
        written += self._write_back(bucket)

    def _finish_step(self) -> None:
        self._at_point("end")
        if self.update_mode == "delayed":
            self._slots.hold_pending()
        else:
            self._slots.written_back()
        self._end_step()

    def _undo_provisional(self) -> None:
        """in_backward's updates made during a backward whose step() has not come are undone."""
        with self._lock:
            if self._slots.any_provisional():
                self._roll_back()

    def _take_parameters_for_step(self) -> None:
        """Written parameters become masters before this step's updates read them. In_backward,
        a bucket already updated cannot take a write made after its update: refused."""
        slots: Iterable[int] = range(len(self._params))
        if self.update_mode == "in_backward":
            updated = self._slots.slots_updated(True)
            late = self._slots.written(updated, self._shards(updated))
            if late:
                self._roll_back()
                self._discard_step()
                raise RuntimeError(
                    f"stowage.offload.{type(self).__name__}(update='in_backward'): {self._slot_name(late[0])} was "
                    "written after backward updated it, before step(); that update does not see the write. Write "
                    "parameters after step() (or before backward), or use update='exact'. Nothing was applied.")
            slots = self._slots.slots_updated(False)
        self._take_written_parameters(slots)

    def _collect_gradients(self) -> None:
        """The gradients present now are the step's: those not copied out yet, or changed since
        they were (by a hook, clipping, a write), are copied; in check mode every one copied is
        compared, bit for bit, with the gradient present."""
        grads, shards = self._gradients()
        if self._slots.collect_late(grads, shards) and not self._warned_recopy:
            self._warned_recopy = True
            warnings.warn(f"stowage.offload.{type(self).__name__}: gradients changed after backward (clipping "
                          "or unscaling through torch?), so step() copies them out again. "
                          "optimizer.clip_grad_norm_() clips without that copy.", stacklevel=outside_stowage())
        if not checking.enabled():
            return
        index = self._slots.first_changed_gradient(shards)
        if index >= 0:
            raise RuntimeError(
                f"stowage check: the gradient of {self._checked_name(index)} "
                f"copied out at step {checking.step()} is not, bit for bit, the gradient present at step(): it "
                "was changed in a way the content watch did not see, or the copy out corrupted it. Nothing of "
                "the step was applied.")

    def _step_on_device(self) -> None:
        inner = self._device_optimizer
        if inner is None:
            return
        for ours, theirs in zip(self._device_group_sources, inner.param_groups):
            theirs.update({k: v for k, v in ours.items() if k != "params"})
        for name in ("grad_scale", "found_inf"):
            if getattr(self, name, None) is not None:
                setattr(inner, name, getattr(self, name))
        try:
            inner.step()
        finally:
            for name in ("grad_scale", "found_inf"):
                if hasattr(inner, name):
                    delattr(inner, name)
        for param in self._device_parameters():
            if param in inner.state:
                self.state[param] = inner.state[param]

    def _check_in_backward_exact(self, scale: float) -> None:
        """Buckets updated during backward took the gradients as they were copied out, unscaled:
        refused (nothing applied) when the step needs something else of them."""
        stale = self._slots.stale_gradients(*self._gradients())
        if stale < 0:
            return  # nothing ran ahead: step() updates every bucket as "exact" would
        if scale != 1.0 or getattr(self, "found_inf", None) is not None or stale:
            self._roll_back()
            self._discard_step()
            raise RuntimeError(
                f"stowage.offload.{type(self).__name__}(update='in_backward') already updated from the gradients as "
                "backward left them, but they were changed afterwards (a GradScaler, clipping through torch, or "
                f"{stale} gradients replaced, dropped or written after backward): that update does not match "
                "them. Use update='exact' (the default) with loss scaling or gradient edits, or clip with "
                "optimizer.clip_grad_norm_(). Nothing was applied.")

    def _redo_outdated_updates(self) -> None:
        """in_backward: updates made during backward with options their param group no longer has
        (a scheduler stepped, or lr set, between backward and step()) are undone, and step() makes
        them again with the options it finds, as "exact" would (the work backward did is done
        again: step the scheduler after step(), or use update='exact')."""
        with self._lock:
            outdated = self._slots.outdated_updates(self._groups)
            if not outdated:
                return
            for index in self._slots.roll_back_buckets(outdated):
                self.state.pop(self._params[index], None)
        if not self._warned_options:
            self._warned_options = True
            warnings.warn(f"stowage.offload.{type(self).__name__}(update='in_backward'): a param group's options "
                          "(lr, betas, ...) changed between backward and step(), so step() undoes the updates "
                          "made during backward with the old ones and makes them again; change them after step() "
                          "(a scheduler's step() included) to keep the overlap.", stacklevel=outside_stowage())

    def _submit(self, bucket: int, scale: float) -> None:
        """Queues `bucket`'s host update (its step counts incremented, the update's runs and, in_backward,
        its undo copies made in C++)."""
        self._add_state_entries(self._slots.submit(bucket, self._groups[self._slots.group_of(bucket)], scale))

    def _add_state_entries(self, slots: list[int]) -> None:
        for index in slots:
            if self._params[index] not in self.state:  # the entry's views, made once
                self.state[self._params[index]] = self._slots.state_entry(index)

    def _write_back(self, bucket: int) -> list[int]:
        """Waits for `bucket`'s update and starts writing its parameters back; returns its slots
        (none when it has no update: written back already, or none made)."""
        if not self._slots.updated(bucket):
            return []
        slots = self._slots.updated_slots(bucket)
        self._slots.write_back(bucket, self._shards(slots))
        return slots

    def _check_arrivals(self, slots: list[int]) -> None:
        """Check mode: each parameter written back is, bit for bit, what the host update made."""
        if not checking.enabled() or not slots:
            return
        index = self._slots.first_changed_arrival(slots, self._shards(slots))
        if index < 0:
            return
        raise RuntimeError(
            f"stowage check: {self._checked_name(index)}, arrived changed "
            f"at step {checking.step()}: its bytes on the device differ from the host update's. The copy back "
            "(the link, or host memory) corrupted it; the step was finished and its update stands on the host.")

    def _write_back_pending(self) -> None:
        """delayed: the last step's updates written back, whole."""
        written: list[int] = []
        run_whole([functools.partial(self._write_back_for_step, b, written) for b in self._slots.pending_buckets])
        self._slots.clear_pending()
        self._slots.written_back()
        self._check_arrivals(written)

    def _roll_back(self) -> None:
        """Undoes the provisional (in_backward) updates of this step: waits for them, restores
        the states and step counts they changed."""
        with interrupts_held():
            for index in self._slots.roll_back():
                self.state.pop(self._params[index], None)

    def _discard_step(self) -> None:
        """Forgets this step's gradients (a skipped step): nothing was applied."""
        self._slots.discard_step()
        self._clip_coefficient = None
        self._backward_end.disarm()

    def _end_step(self) -> None:
        self._slots.end_step()
        self._clip_coefficient = None
        self._backward_end.disarm()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad; without a step() since the last backward, that backward's gradients
        (and, in_backward, its provisional updates) are dropped as torch's would be."""
        self._deferred = None
        self._undo_provisional()
        with self._lock:
            self._slots.reset_arrivals()
            self._backward_end.disarm()
        super().zero_grad(set_to_none)

    # --- checkpoints and the end --------------------------------------------------------------

    def flush(self) -> None:
        """Makes the states and parameters those of the last step(): delayed updates write the
        pending update's parameters back now; in_backward's updates made during a backward whose
        step() has not come are undone (step() makes them again), so that a state_dict taken
        between backward and step() (a KeyboardInterrupt's handler) pairs the states with the
        parameters they belong to."""
        with interrupts_held():
            self._undo_provisional()
            self._slots.finish_pending()
            self._take_written_parameters(self._slots.pending_slots())
            self._write_back_pending()
            self._slots.synchronize()

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
        by_param = torch_module().check_adam_state(self.param_groups, state_dict, type(self).__name__, local)
        self.flush()
        for ours, saved in zip(self.param_groups, state_dict["param_groups"]):
            ours.update({k: v for k, v in saved.items() if k != "params"})
        self._join([(p, g) for p, g in self._waiting if by_param.get(p)])
        for index, param in enumerate(self._params):
            saved = by_param.get(param)
            self._slots.load(index, saved, local(param), local)
            if saved:
                self.state[param] = self._slots.state_entry(index)
            else:
                self.state.pop(param, None)
        self._slots.parameters_are(range(len(self._params)), self._shards())
        if self._device_optimizer is not None:
            inner_state = torch_module().split_device_state(self._device_optimizer.param_groups, by_param)
            self._device_optimizer.load_state_dict(inner_state)
            for param in self._device_parameters():
                if param in self._device_optimizer.state:
                    self.state[param] = self._device_optimizer.state[param]

    def host_stats(self) -> dict[str, Any]:
        """The host memory the states take (bytes; pinned_bytes and pageable_bytes are the whole
        device's pinned pool's, which the activations' offloaded buffers share), where it is placed, the
        CPUs that update it, the time spent in host updates so far and the time spent comparing
        parameters' and gradients' bytes (seconds)."""
        return self._slots.host_stats()

    def close(self) -> None:
        """Finishes pending updates and copies and lets go of the hooks."""
        self.flush()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


class AdamW(Adam):
    """torch.optim.AdamW (decoupled weight decay) with host-resident states; see stowage.offload.adam."""

    _torch_class = torch.optim.AdamW

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False, fused: bool | None = None,
                 update: str = "exact", device_fraction: float = 0.0, bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 host_memory_limit: int | str | None = None, master_weights: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True, update=update, device_fraction=device_fraction,
                         bucket_numel=bucket_numel, host_memory_limit=host_memory_limit,
                         master_weights=master_weights)
