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
- the gradient used is the one present at step(): one replaced (``p.grad = ...``) or written after
  backward (clipping, unscaling, ``p.grad.data.clamp_()``) is copied again;
- a write to a parameter between steps wins, ``p.data.clamp_()`` and ``p.data.copy_()`` included
  (they leave no trace in the version counter: the parameters' bytes are compared on the device,
  python/bindings/torch/content_watch.hpp), and the write becomes the master weights;
- a backward that raises leaves nothing applied; sparse gradients and bad state_dicts are refused
  at first sight, naming the parameter or the field.

When the update runs (``update=``):
- ``"exact"`` (default): in step(), once gradient clipping and the GradScaler's inf check are
  known, bucket after bucket, each bucket's write-back overlapping the next one's update. The
  copies out overlap backward; the update itself does not (it adds its time to the step).
- ``"in_backward"``: a bucket is updated as soon as its gradients have arrived, hidden behind
  the rest of backward; the update is provisional until step() (zero_grad() without step(), or a
  backward that raises, undoes it: host copies of the states, 12-16 bytes a parameter). Exact
  only when nothing changes the gradients after backward: step() raises if a GradScaler,
  ``clip_grad_norm_`` or anything else did, or replaced or dropped one; and a second backward
  before step() is refused unless its micro-batches are marked (``accumulating()``).
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
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator

import torch

from stowage import checking
from stowage.byte_counts import byte_count
from stowage.serving import torch_module
from stowage.offload.adam_buckets import DEFAULT_BUCKET_NUMEL, Bucket, Slot, build_buckets, kept_on_device
from stowage.offload.adam_state import (check_loadable, describe_parameter, load_offloaded_state,
                                        split_device_state)
from stowage.offload.gradient_arrival import BackwardEnd, make_ddp_comm_hook, weak_method
from stowage.offload.sharded import is_sharded, local, shaped_like
from stowage.offload.slot_watch import SlotWatch
from stowage.warning_site import outside_stowage

UPDATE_MODES = ("exact", "in_backward", "delayed")


class Adam(torch.optim.Optimizer):
    """torch.optim.Adam (its update, options and state_dict) with host-resident states; see the
    module's documentation. Contract: used from one thread, as torch's optimizers."""

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
        self._bucket_numel = bucket_numel
        self._device = self._check_parameters(p for g in self.param_groups for p in g["params"])
        offloaded, kept = self._split_by_fraction(device_fraction)
        self._device_group_sources: list[dict[str, Any]] = []
        self._device_optimizer = self._make_device_optimizer(kept)
        self._store = torch_module().HostStateStore(str(self._device))
        self._buckets: list[Bucket] = []
        self._slots: dict[torch.Tensor, Slot] = {}
        self._waiting: list[tuple[torch.Tensor, dict[str, Any]]] = []  # frozen: no states until a gradient
        self._watch = SlotWatch(self._device)  # parameters and gradients changed behind our back
        self._hooks: list[Any] = []
        self._transfers = torch_module().OptimizerTransfers(str(self._device))  # on the offload engine
        self._queue = torch_module().UpdateQueue(torch_module().cpus_near(self._store_bus_id() or ""))
        self._backward_end = BackwardEnd(weak_method(self._backward_ended), weak_method(self._backward_abandoned))
        checking.apply()
        self._lock = threading.Lock()  # DDP's hook callbacks may run on the process group's threads
        self._accumulating = 0
        self._ddp_attached = False
        self._grad_buffer = 0  # which staging buffer this step's gradients go to
        self._pending: list[Bucket] = []  # delayed: updated on the host, not yet written back
        self._clip_coefficient: torch.Tensor | None = None
        self._parameters_checked = False  # in_backward: written parameters taken this step
        self._warned_recopy = False
        self._warned_clip = False
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
        """Host states, watches and hooks for `pairs` (parameters offloaded from now on)."""
        if not pairs:
            return
        limit = None if self._limit is None else self._limit - self._store.stats()["allocated_bytes"]
        grad_buffers = 2 if self.update_mode == "delayed" else 1
        buckets = build_buckets(pairs, self._store, self._bucket_numel, grad_buffers, limit, self.master_weights)
        slots = [slot for bucket in buckets for slot in bucket.slots]
        first = len(self._slots)
        for offset, slot in enumerate(slots):
            slot.index = first + offset
            self._slots[slot.param] = slot
        self._buckets.extend(buckets)
        self._watch.add(slots)
        joined = {id(p) for p, _ in pairs}
        self._waiting = [(p, g) for p, g in self._waiting if id(p) not in joined]
        for slot in slots:
            if slot.param.requires_grad:
                self._hooks.append(slot.param.register_post_accumulate_grad_hook(
                    weak_method(self._gradient_accumulated)))

    def _join_waiting(self) -> None:
        """Frozen parameters that now have a gradient (unfrozen) join, as torch's optimizer would
        start their states at their first step."""
        self._join([(p, g) for p, g in self._waiting if p.grad is not None])

    def _state_entry(self, slot: Slot) -> dict[str, torch.Tensor]:
        entry = {"step": slot.step, "exp_avg": slot.exp_avg, "exp_avg_sq": slot.exp_avg_sq}
        if slot.max_exp_avg_sq is not None:
            entry["max_exp_avg_sq"] = slot.max_exp_avg_sq
        if slot.master.dtype != slot.param.dtype:
            entry["master"] = slot.master  # fp32 masters of a bf16 / fp16 parameter (master_weights)
        return entry

    def _name(self, param: torch.Tensor) -> str:
        return describe_parameter(self.param_groups, param)

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
        if self._accumulating or self._ddp_attached or param.grad is None:
            return
        self._backward_end.arm()
        self._arrive(param, param.grad)

    def _arrive(self, param: torch.Tensor, gradient: torch.Tensor) -> None:
        if self._accumulating:
            return
        slot = self._slots.get(param)
        if slot is None:
            return  # kept on the device
        if gradient.is_sparse:
            raise self._sparse_refusal(param)
        with self._lock:
            self._arrive_locked(slot, gradient)

    def _arrive_locked(self, slot: Slot, gradient: torch.Tensor) -> None:
        bucket = slot.bucket
        assert bucket is not None
        if self.update_mode == "in_backward":
            if bucket.updated is not None:
                self._roll_back()
                raise RuntimeError(
                    f"stowage.offload.{type(self).__name__}(update='in_backward'): a gradient arrived twice in one "
                    "step, and its bucket was already updated from the first: a second backward before step() "
                    "(gradient accumulation that is not marked). Run the micro-batches before the last inside "
                    "optimizer.accumulating() (or DDP's no_sync()), or use update='exact'. Nothing was applied.")
            if not self._parameters_checked:
                self._parameters_checked = True
                self._take_written_parameters(list(self._slots.values()))
        self._copy_out(slot, gradient)
        if bucket.arrived == len(bucket.slots):
            bucket.copied_event = self._transfers.copies_out_issued()
            if self.update_mode == "in_backward":
                self._submit(bucket, 1.0)

    def _copy_out(self, slot: Slot, gradient: torch.Tensor) -> None:
        """Starts copying `gradient` into `slot`'s staging view and counts it as arrived."""
        bucket = slot.bucket
        assert bucket is not None
        shard = local(gradient)
        if shard.numel() != slot.numel:
            raise ValueError(f"stowage.offload.{type(self).__name__}: the gradient of {self._name(slot.param)} has "
                             f"{shard.numel()} elements where the parameter has {slot.numel}")
        self._transfers.copy_out(slot.grad_view(bucket.grads[self._grad_buffer]), shard)
        if slot.final_version is None:
            bucket.arrived += 1
        slot.final_version = shard._version
        slot.copied = weakref.ref(gradient)

    def _backward_ended(self) -> None:
        """The gradients copied in this backward, as they are at its end: what step() compares."""
        with self._lock:
            self._watch.gradients_final(list(self._slots.values()))

    def _backward_abandoned(self) -> None:
        """A backward that copied gradients (and, in_backward, updated buckets) raised: nothing of
        it may count."""
        with self._lock:
            self._roll_back()
            self._reset_arrivals()

    def _changed_gradients(self) -> set[int]:
        return self._watch.changed_gradients(list(self._slots.values()))

    # --- parameters written by someone else ---------------------------------------------------

    def _take_written_parameters(self, slots: list[Slot]) -> list[Slot]:
        """Parameters whose bytes changed since their last write-back (``.data`` writes, a loaded
        checkpoint, DDP's broadcast) become the masters (and the outputs a delayed write-back
        would send); returns those slots."""
        shards = [local(s.param) for s in slots]
        for slot, shard in zip(slots, shards):
            if shard.numel() != slot.numel:
                raise ValueError(f"stowage.offload.{type(self).__name__}: {self._name(slot.param)} was replaced "
                                 f"by a tensor of {shard.numel()} elements where it had {slot.numel}; make a new "
                                 "optimizer for parameters of a new shape")
        written = self._watch.written(slots)
        for slot in written:
            shard = local(slot.param).detach()
            slot.master.copy_(shard)
            bucket = slot.bucket
            if bucket is not None and bucket.out is not None:
                slot.grad_view(bucket.out).copy_(shard.reshape(-1))
        self._watch.parameters_are(written)
        return written

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
        with self._lock:
            if any(b.updated is not None for b in self._buckets):
                self._roll_back()
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

    # --- the step -----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._join_waiting()
        scale, skip = self._gradient_scale()
        if self.update_mode == "delayed":
            for bucket in self._pending:
                if bucket.updated is not None:
                    self._finish(bucket)
        self._take_parameters_for_step()
        if self.update_mode == "in_backward":
            self._check_in_backward_exact(scale)
        if self.update_mode == "delayed":
            self._write_back_pending()
        if skip:
            self._discard_step()
            return loss
        self._step_on_device()
        self._collect_late_gradients()
        with self._lock:
            for bucket in self._buckets:
                if bucket.updated is None:
                    self._submit(bucket, scale)
        updated = [b for b in self._buckets if b.updated is not None]
        if self.update_mode == "delayed":
            self._pending = updated
            self._grad_buffer ^= 1
        else:
            for bucket in updated:
                self._write_back(bucket)
            self._transfers.written_back()
        self._end_step()
        return loss

    def _take_parameters_for_step(self) -> None:
        """Written parameters become masters before this step's updates read them. In_backward,
        a bucket already updated cannot take a write made after its update: refused."""
        slots = list(self._slots.values())
        if self.update_mode == "in_backward":
            updated = [s for s in slots if s.bucket is not None and s.bucket.updated is not None]
            late = self._watch.written(updated)
            if late:
                self._roll_back()
                self._discard_step()
                raise RuntimeError(
                    f"stowage.offload.{type(self).__name__}(update='in_backward'): {self._name(late[0].param)} was "
                    "written after backward updated it, before step(); that update does not see the write. Write "
                    "parameters after step() (or before backward), or use update='exact'. Nothing was applied.")
            slots = [s for s in slots if s.bucket is None or s.bucket.updated is None]
        self._take_written_parameters(slots)

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

    def _collect_late_gradients(self) -> None:
        """Copies the gradients present at step() that were not copied out during backward, or
        that changed after it, now; forgets those dropped since."""
        changed = self._changed_gradients()
        for slot in self._slots.values():
            grad = slot.param.grad
            if grad is None:
                if slot.final_version is not None:
                    slot.final_version = None
                    slot.copied = None
                    slot.bucket.arrived -= 1  # type: ignore[union-attr]
                continue
            if grad.is_sparse:
                raise self._sparse_refusal(slot.param)
            if slot.final_version is not None and slot.index not in changed:
                continue
            if slot.final_version is not None and not self._warned_recopy:
                self._warned_recopy = True
                warnings.warn(f"stowage.offload.{type(self).__name__}: gradients changed after backward (clipping "
                              "or unscaling through torch?), so step() copies them out again. "
                              "optimizer.clip_grad_norm_() clips without that copy.", stacklevel=outside_stowage())
            self._copy_out(slot, grad)
            slot.bucket.copied_event = None  # type: ignore[union-attr]  # a new event covers this copy too
        for bucket in self._buckets:
            if bucket.arrived and bucket.copied_event is None:
                bucket.copied_event = self._transfers.copies_out_issued()

    def _check_in_backward_exact(self, scale: float) -> None:
        """Buckets updated during backward took the gradients as backward left them, unscaled:
        refused (nothing applied) when the step needs something else of them."""
        updated = {id(b) for b in self._buckets if b.updated is not None}
        if not updated:
            return  # nothing ran ahead: step() updates every bucket as "exact" would
        changed = self._changed_gradients()
        stale = [s for s in self._slots.values() if s.index in changed and id(s.bucket) in updated]
        if scale != 1.0 or getattr(self, "found_inf", None) is not None or stale:
            self._roll_back()
            self._discard_step()
            raise RuntimeError(
                f"stowage.offload.{type(self).__name__}(update='in_backward') already updated from the gradients as "
                "backward left them, but they were changed afterwards (a GradScaler, clipping through torch, or "
                f"{len(stale)} gradients replaced, dropped or written after backward): that update does not match "
                "them. Use update='exact' (the default) with loss scaling or gradient edits, or clip with "
                "optimizer.clip_grad_norm_(). Nothing was applied.")

    def _submit(self, bucket: Bucket, scale: float) -> bool:
        """Queues `bucket`'s host update (its step counts incremented, the update's runs and, in_backward,
        its undo copies made in C++); False when none of its parameters has a gradient."""
        slots = [s for s in bucket.slots if s.final_version is not None]
        if not slots:
            return False
        group = bucket.group
        if group["amsgrad"] and bucket.max_exp_avg_sq is None:
            raise ValueError(f"stowage.offload.{type(self).__name__}: amsgrad was turned on in a param group "
                             "after its states were made; set it when the optimizer is made")
        hyper = dict(lr=float(group["lr"]), beta1=float(group["betas"][0]), beta2=float(group["betas"][1]),
                     eps=float(group["eps"]), weight_decay=float(group["weight_decay"]), grad_scale=scale,
                     decoupled_weight_decay=bool(group.get("decoupled_weight_decay", False)),
                     maximize=bool(group["maximize"]))
        bucket.updated = bucket.host.submit(
            self._queue, [s.final_version is not None for s in bucket.slots], **hyper, grad_buffer=self._grad_buffer,
            provisional=self.update_mode == "in_backward", cpu_sqrt=self._device.type == "cpu",  # torch's CPU sqrt
            copied=bucket.copied_event, returned=bucket.returned_event)
        for slot in slots:
            self.state.setdefault(slot.param, self._state_entry(slot))
        bucket.updated_slots = slots
        return True

    def _write_back(self, bucket: Bucket) -> None:
        """Waits for `bucket`'s update and starts writing its parameters back."""
        if bucket.updated is None:
            return
        self._finish(bucket)
        source = bucket.out if bucket.out is not None else bucket.master
        slots, bucket.updated_slots = bucket.updated_slots, []
        shards = [local(slot.param) for slot in slots]
        views = [slot.grad_view(source).view(shard.shape) for slot, shard in zip(slots, shards)]
        bucket.returned_event = self._transfers.write_back(shards, views)
        self._transfers.written_back()  # the checksums below read the parameters written back
        self._watch.parameters_are(slots, shards)
        bucket.updated = None
        if checking.enabled():
            self._check_arrivals(slots, shards, views)

    def _finish(self, bucket: Bucket) -> None:
        """Waits for `bucket`'s update (Note [Bounded waits]); raises what it raised."""
        bucket.updated.wait(f"the host update of bucket {self._buckets.index(bucket)}", bucket.bytes)

    def _check_arrivals(self, slots: list[Slot], shards: list[torch.Tensor], views: list[torch.Tensor]) -> None:
        """Check mode: each parameter written back is, bit for bit, what the host update made."""
        self._transfers.synchronize(sum(v.numel() * v.element_size() for v in views))
        for slot, shard, view in zip(slots, shards, views):
            if torch.equal(_bits(shard.detach().to("cpu")), _bits(view)):
                continue
            name = checking.parameter_name(slot.param)
            raise RuntimeError(
                f"stowage check: {f'parameter {name!r}, ' if name else ''}{self._name(slot.param)}, arrived changed "
                f"at step {checking.step()}: its bytes on the device differ from the host update's. The copy back "
                "(the link, or host memory) corrupted it; stowage stopped the step there.")

    def _write_back_pending(self) -> None:
        for bucket in self._pending:
            self._write_back(bucket)
        self._pending = []
        self._transfers.written_back()

    def _roll_back(self) -> None:
        """Undoes the provisional (in_backward) updates of this step: waits for them, restores
        the states and step counts they changed."""
        provisional = [b for b in self._buckets if b.updated is not None and b not in self._pending]
        for bucket in provisional:
            self._finish(bucket)
        for bucket in self._buckets:
            if bucket.host.restore():
                for slot in bucket.slots:
                    if float(slot.step) == 0:
                        self.state.pop(slot.param, None)
        for bucket in provisional:
            bucket.updated = None
            bucket.updated_slots = []

    def _reset_arrivals(self) -> None:
        for bucket in self._buckets:
            bucket.arrived = 0
            bucket.copied_event = None
        for slot in self._slots.values():
            slot.final_version = None
            slot.copied = None
        self._parameters_checked = False

    def _discard_step(self) -> None:
        """Forgets this step's gradients (a skipped step): nothing was applied."""
        self._end_step()
        for bucket in self._buckets:
            if bucket not in self._pending:
                bucket.updated = None
                bucket.updated_slots = []

    def _end_step(self) -> None:
        for bucket in self._buckets:
            if self.update_mode == "in_backward":
                bucket.updated = None
            bucket.host.forget()
        self._reset_arrivals()
        self._clip_coefficient = None
        self._backward_end.disarm()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad; without a step() since the last backward, that backward's gradients
        (and, in_backward, its provisional updates) are dropped as torch's would be."""
        with self._lock:
            if any(b.updated is not None for b in self._buckets if b not in self._pending):
                self._roll_back()
            self._reset_arrivals()
            self._backward_end.disarm()
        super().zero_grad(set_to_none)

    def _sparse_refusal(self, param: torch.Tensor) -> RuntimeError:
        return RuntimeError(
            f"stowage.offload.{type(self).__name__}: {self._name(param)} has a sparse gradient "
            "(an nn.Embedding(sparse=True)?), which Adam does not take (torch's refuses it too): use "
            "torch.optim.SparseAdam for it, or a dense embedding")

    # --- checkpoints and the end --------------------------------------------------------------

    def flush(self) -> None:
        """Delayed updates: writes the pending update's parameters back now."""
        for bucket in self._pending:
            if bucket.updated is not None:
                self._finish(bucket)
        self._take_written_parameters([s for b in self._pending for s in b.slots])
        self._write_back_pending()
        self._transfers.synchronize(sum(b.bytes for b in self._buckets))

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        saved = super().state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        for index, entry in saved["state"].items():
            param = params[index]
            if param in self._slots and is_sharded(param):  # FSDP2: sharded like the parameter
                saved["state"][index] = {k: (v if k == "step" else shaped_like(v, param)) for k, v in entry.items()}
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load_state_dict, checked whole before anything changes: a bad entry is refused
        naming the parameter and the field."""
        by_param = check_loadable(self.param_groups, state_dict, type(self).__name__)
        self.flush()
        for ours, saved in zip(self.param_groups, state_dict["param_groups"]):
            ours.update({k: v for k, v in saved.items() if k != "params"})
        self._join([(p, g) for p, g in self._waiting if by_param.get(p)])
        for param, slot in self._slots.items():
            saved = by_param.get(param)
            load_offloaded_state(slot, saved)
            if saved:
                self.state[param] = self._state_entry(slot)
            else:
                self.state.pop(param, None)
        self._watch.parameters_are(list(self._slots.values()))
        if self._device_optimizer is not None:
            inner_state = split_device_state(self._device_optimizer, by_param)
            self._device_optimizer.load_state_dict(inner_state)
            for param in self._device_parameters():
                if param in self._device_optimizer.state:
                    self.state[param] = self._device_optimizer.state[param]

    def host_stats(self) -> dict[str, Any]:
        """The host memory the states take (bytes, pinned or pageable), where it is placed, the
        CPUs that update it, the time spent in host updates so far and the time spent comparing
        parameters' and gradients' bytes (seconds)."""
        return {**self._store.stats(), "placement": self._store.placement(),
                "update_cpus": self._queue.cpus,
                "update_threads": self._queue.threads,
                "update_seconds": self._queue.busy_seconds,
                "content_watch_seconds": self._watch.seconds}

    def close(self) -> None:
        """Finishes pending updates and copies and lets go of the hooks."""
        self.flush()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def __del__(self) -> None:
        transfers = getattr(self, "_transfers", None)
        if transfers is not None:
            with contextlib.suppress(Exception):
                transfers.synchronize()  # before the host buffers the copies use go


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers of its element size, so that equal bits compare equal (NaN too)."""
    return tensor.reshape(-1).view({8: torch.int64, 4: torch.int32, 2: torch.int16}[tensor.element_size()])


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
