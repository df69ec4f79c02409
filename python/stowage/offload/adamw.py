"""stowage.offload.AdamW: torch.optim.AdamW with its fp32 master weights and moments in host
memory, updated on the CPU while the GPU goes on.

    optimizer = stowage.offload.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    for batch in data:
        loss_of(model, batch).backward()   # gradients are copied out as they become final
        optimizer.step()                   # the host update; parameters stream back
        optimizer.zero_grad()

Each gradient is copied to pinned host memory as soon as it is final (grouped in buckets); the
update runs in one pass over fp32 masters and moments, gradients in the device's precision in and
parameters out (the C++ kernel); updated parameters stream back on a copy stream of their own.

When the update runs (``update=``):
- ``"exact"`` (default): in step(), once gradient clipping and the GradScaler's inf check are
  known, bucket after bucket, each bucket's write-back overlapping the next one's update. The
  copies out overlap backward; the update itself does not (it adds its time to the step).
- ``"in_backward"``: a bucket is updated as soon as its gradients have arrived, hidden behind
  the rest of backward. Exact only when nothing changes the gradients after backward: step()
  raises if a GradScaler, ``clip_grad_norm_`` or anything else did (the update already ran).
- ``"delayed"``: step() hands this step's update to the host and returns; its parameters are
  written back at the next step(), so forward and backward run on parameters one update behind
  (ZeRO-Offload's delayed parameter update): hides the update fully, and changes the numerics.

Gradient accumulation: run the micro-batches before the last inside ``optimizer.accumulating()``
(gradients are not final there, so nothing is copied). Under DDP, call ``optimizer.attach(ddp)``:
the gradients are then taken after DDP's all-reduce, and DDP's own ``no_sync()`` marks the
micro-batches. Under FSDP2 (``fully_shard``) nothing is needed: FSDP2 calls the hooks after each
reduce-scatter, and each rank holds and updates only its shards (states are DTensors in
state_dict, sharded like the parameters). Clipping: ``optimizer.clip_grad_norm_(max_norm)`` folds the coefficient into the
update; ``torch.nn.utils.clip_grad_norm_`` also works, at the cost of copying every gradient
again in step(). A GradScaler's inf check skips the step with nothing applied.

``device_fraction``: the share of parameters (by count; the first ones, whose gradients arrive
last in backward) whose states stay on the device, updated there by torch's fused AdamW as
torch's AdamW would (bf16 parameters get bf16 moments there). ``state_dict()`` is
torch.optim.AdamW's format; parameters that are not fp32 add their fp32 masters under
``"master"``. Not supported: amsgrad, maximize, sparse gradients, parameters on several devices.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator

import torch

from stowage.memory import _bytes, _torch_module
from stowage.offload.adamw_buckets import DEFAULT_BUCKET_NUMEL, Bucket, Slot, build_buckets, update_runs
from stowage.offload.adamw_state import load_offloaded_state, split_device_state
from stowage.offload.gradient_arrival import BackwardEnd, make_ddp_comm_hook, weak_method
from stowage.offload.host_transfers import HostTransfers
from stowage.offload.sharded import is_sharded, local, shaped_like
from stowage.offload.update_worker import UpdateWorker, cpus_near

UPDATE_MODES = ("exact", "in_backward", "delayed")


def _torch_adamw_defaults(**hyper: Any) -> dict[str, Any]:
    """torch.optim.AdamW's defaults for these hyper-parameters: the same group keys, so that
    state_dicts move between the two."""
    return dict(torch.optim.AdamW([torch.zeros(1)], **hyper).defaults)


def _check_hyper(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


class AdamW(torch.optim.Optimizer):
    """AdamW (torch.optim.AdamW's update and state_dict) with host-resident states; see the
    module's documentation. Contract: used from one thread, as torch's optimizers."""

    _step_supports_amp_scaling = True  # GradScaler hands over grad_scale and found_inf

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, amsgrad: bool = False, maximize: bool = False,
                 update: str = "exact", device_fraction: float = 0.0, bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 host_memory_limit: int | str | None = None) -> None:
        _check_hyper(lr, betas, eps, weight_decay)
        if amsgrad or maximize:
            raise ValueError("stowage.offload.AdamW supports neither amsgrad nor maximize "
                             "(use torch.optim.AdamW for those)")
        if update not in UPDATE_MODES:
            raise ValueError(f"update must be one of {UPDATE_MODES}, not {update!r}")
        if not 0.0 <= device_fraction <= 1.0:
            raise ValueError(f"device_fraction must lie in [0, 1], not {device_fraction!r}")
        if bucket_numel < 1:
            raise ValueError(f"bucket_numel must be positive, not {bucket_numel!r}")
        self._constructing = True
        super().__init__(params, _torch_adamw_defaults(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._constructing = False
        self.update_mode = update
        self.device_fraction = device_fraction
        limit = None if host_memory_limit is None else _bytes(host_memory_limit)
        self._device = self._check_parameters()
        offloaded, kept = self._split_by_fraction(device_fraction)
        self._device_group_sources: list[dict[str, Any]] = []
        self._device_optimizer = self._make_device_optimizer(kept)
        # (The limit is checked before anything is taken, against what the states need; the
        # pool's own rounding must not make an allowance that fits exactly fail.)
        self._store = _torch_module().HostStateStore(str(self._device))
        grad_buffers = 2 if update == "delayed" else 1
        self._buckets: list[Bucket] = build_buckets(offloaded, self._store, bucket_numel, grad_buffers, limit)
        self._slots: dict[torch.Tensor, Slot] = {s.param: s for b in self._buckets for s in b.slots}
        for slot in self._slots.values():
            self.state[slot.param] = self._state_entry(slot)
        self._transfers = HostTransfers(self._device)
        pci_bus_id = self._store_bus_id()
        self._worker = UpdateWorker(cpus_near(pci_bus_id))
        self._backward_end = BackwardEnd(weak_method(self._record_final_versions))
        self._hooks = [p.register_post_accumulate_grad_hook(weak_method(self._gradient_accumulated)) for p in self._slots]
        self._accumulating = 0
        self._ddp_attached = False
        self._grad_buffer = 0  # which staging buffer this step's gradients go to
        self._pending: list[Bucket] = []  # delayed: updated on the host, not yet written back
        self._clip_coefficient: torch.Tensor | None = None
        self._warned_recopy = False
        self._lock = threading.Lock()  # DDP's hook callbacks may run on the process group's threads

    # --- construction -------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if not getattr(self, "_constructing", True):
            raise ValueError("stowage.offload.AdamW lays its host states out at construction: "
                             "pass every parameter group to the constructor")
        super().add_param_group(param_group)

    def _check_parameters(self) -> torch.device:
        devices = {p.device for g in self.param_groups for p in g["params"]}
        if len(devices) != 1:
            raise ValueError(f"stowage.offload.AdamW takes parameters on one device, not {sorted(map(str, devices))}")
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                    raise ValueError(f"stowage.offload.AdamW updates float32, bfloat16 and float16 "
                                     f"parameters, not {p.dtype}")
        return devices.pop()

    def _split_by_fraction(self, fraction: float) -> tuple[list[tuple[torch.Tensor, dict[str, Any]]],
                                                           list[tuple[torch.Tensor, dict[str, Any]]]]:
        """(offloaded, kept on the device): the first parameters up to `fraction` of the count stay."""
        pairs = [(p, g) for g in self.param_groups for p in g["params"]]
        budget = fraction * sum(p.numel() for p, _ in pairs)
        kept, offloaded, taken = [], [], 0
        for param, group in pairs:
            if not offloaded and taken + param.numel() <= budget:
                kept.append((param, group))
                taken += param.numel()
            else:
                offloaded.append((param, group))
        return offloaded, kept

    def _make_device_optimizer(self, kept: list[tuple[torch.Tensor, dict[str, Any]]]) -> torch.optim.AdamW | None:
        if not kept:
            return None
        sources = [g for g in self.param_groups if any(pg is g for _, pg in kept)]
        self._device_group_sources = sources  # our group behind each of the inner optimizer's
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [p for p, pg in kept if pg is g]}
                  for g in sources]
        for group in groups:
            group["fused"] = True
            group["foreach"] = None
        try:
            return torch.optim.AdamW(groups)
        except RuntimeError:
            for group in groups:
                group["fused"] = None
            return torch.optim.AdamW(groups)

    def _store_bus_id(self) -> str | None:
        if self._device.type != "cuda":
            return None
        return str(torch.cuda.get_device_properties(self._device).pci_bus_id) or None

    @staticmethod
    def _state_entry(slot: Slot) -> dict[str, torch.Tensor]:
        entry = {"step": slot.step, "exp_avg": slot.exp_avg, "exp_avg_sq": slot.exp_avg_sq}
        if slot.param.dtype != torch.float32:
            entry["master"] = slot.master
        return entry

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
        with self._lock:
            self._arrive_locked(slot, gradient)

    def _arrive_locked(self, slot: Slot, gradient: torch.Tensor) -> None:
        bucket = slot.bucket
        assert bucket is not None
        if self.update_mode == "in_backward" and bucket.updated is not None:
            raise RuntimeError(
                "stowage.offload.AdamW(update='in_backward'): a gradient arrived twice in one step, so "
                "its bucket was updated from a partial gradient. Run the micro-batches before the last "
                "inside optimizer.accumulating() (or DDP's no_sync()), or use update='exact'.")
        self._copy_out(slot, gradient)
        if bucket.arrived == len(bucket.slots):
            bucket.copied_event = self._transfers.copies_out_issued()
            if self.update_mode == "in_backward":
                self._submit(bucket, 1.0)

    def _copy_out(self, slot: Slot, gradient: torch.Tensor) -> None:
        """Starts copying `gradient` into `slot`'s staging view and counts it as arrived."""
        bucket = slot.bucket
        assert bucket is not None
        gradient = local(gradient)
        self._transfers.copy_out(slot.grad_view(bucket.grads[self._grad_buffer]), gradient)
        if slot.final_version is None:
            bucket.arrived += 1
        slot.final_version = gradient._version

    def _record_final_versions(self) -> None:
        for slot in self._slots.values():
            grad = slot.param.grad
            if slot.final_version is not None and grad is not None:
                slot.final_version = local(grad)._version

    # --- clipping and loss scaling ------------------------------------------------------------

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over this optimizer's gradients, without a pass over the
        offloaded ones: their coefficient is applied as the host update reads them. Returns the
        total norm."""
        if self.update_mode == "in_backward":
            raise RuntimeError("stowage.offload.AdamW(update='in_backward') updates during backward, "
                               "before a norm over all gradients exists: use update='exact' to clip")
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite)
        if is_sharded(total):
            total = total.full_tensor()  # FSDP2: the norm over every rank's shards
        coefficient = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        kept = [local(p.grad) for p in self._device_parameters() if p.grad is not None]
        if kept:
            torch._foreach_mul_(kept, coefficient.to(kept[0].device))
        self._clip_coefficient = coefficient if self._clip_coefficient is None else self._clip_coefficient * coefficient
        return total

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
        scale, skip = self._gradient_scale()
        if self.update_mode == "in_backward":
            self._check_in_backward_exact(scale)
        if self.update_mode == "delayed":
            self._write_back_pending()
        if skip:
            self._discard_step()
            return loss
        self._step_on_device()
        self._refresh_masters()
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

    def _step_on_device(self) -> None:
        inner = self._device_optimizer
        if inner is None:
            return
        for ours, theirs in zip(self._device_group_sources, inner.param_groups):
            theirs.update({k: v for k, v in ours.items() if k not in ("params", "fused", "foreach")})
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

    def _refresh_masters(self) -> None:
        """Parameters written by someone else since the last write-back (a checkpoint loaded into
        the model, DDP's broadcast) become the masters again."""
        for slot in self._slots.values():
            shard = local(slot.param)
            if shard._version != slot.param_version:
                slot.master.copy_(shard.detach())
                slot.param_version = shard._version

    def _collect_late_gradients(self) -> None:
        """Copies the gradients that were not copied out during backward, or that changed after
        it, now."""
        for slot in self._slots.values():
            grad = slot.param.grad
            if grad is None:
                if slot.final_version is not None:
                    slot.final_version = None
                    slot.bucket.arrived -= 1  # type: ignore[union-attr]
                continue
            if grad.is_sparse:
                raise RuntimeError("stowage.offload.AdamW does not support sparse gradients")
            if slot.final_version == local(grad)._version:
                continue
            if slot.final_version is not None and not self._warned_recopy:
                self._warned_recopy = True
                warnings.warn("stowage.offload.AdamW: gradients changed after backward (clipping or "
                              "unscaling through torch?), so step() copies them out again. "
                              "optimizer.clip_grad_norm_() clips without that copy.", stacklevel=3)
            self._arrive_late(slot, grad)
        for bucket in self._buckets:
            if bucket.arrived and bucket.copied_event is None:
                bucket.copied_event = self._transfers.copies_out_issued()

    def _arrive_late(self, slot: Slot, grad: torch.Tensor) -> None:
        self._copy_out(slot, grad)
        assert slot.bucket is not None
        slot.bucket.copied_event = None  # a new event covers this copy too

    def _check_in_backward_exact(self, scale: float) -> None:
        changed = [s for s in self._slots.values()
                   if s.param.grad is not None and s.final_version not in (None, local(s.param.grad)._version)]
        if scale != 1.0 or getattr(self, "found_inf", None) is not None or changed:
            self._worker.wait_all()
            self._discard_step()
            raise RuntimeError(
                "stowage.offload.AdamW(update='in_backward') already updated from the gradients as "
                "backward left them, but they were changed afterwards (a GradScaler, clipping, or "
                f"{len(changed)} gradients written after backward): that update does not match them. "
                "Use update='exact' (the default) with loss scaling or clipping.")

    def _submit(self, bucket: Bucket, scale: float) -> bool:
        """Hands `bucket`'s update to the worker; False when none of its parameters has a gradient."""
        slots = [s for s in bucket.slots if s.final_version is not None]
        if not slots:
            return False
        for slot in slots:
            slot.step += 1
        runs = update_runs(bucket.slots)
        group = bucket.group
        hyper = (float(group["lr"]), float(group["betas"][0]), float(group["betas"][1]), float(group["eps"]),
                 float(group["weight_decay"]))
        grads = bucket.grads[self._grad_buffer]
        kernel = _torch_module().adamw_update
        threads = self._worker.threads
        copied, returned = bucket.copied_event, bucket.returned_event

        def update() -> None:
            if copied is not None:
                copied.synchronize()
            if returned is not None:
                returned.synchronize()  # the last write-back has left `out`
            for begin, end, step in runs:
                out = None if bucket.out is None else bucket.out[begin:end]
                kernel(bucket.master[begin:end], bucket.exp_avg[begin:end], bucket.exp_avg_sq[begin:end],
                       grads[begin:end], out, step, *hyper, scale, threads)

        bucket.updated = self._worker.submit(update)
        bucket.extra["updated_slots"] = slots
        return True

    def _write_back(self, bucket: Bucket) -> None:
        """Waits for `bucket`'s update and starts writing its parameters back."""
        if bucket.updated is None:
            return
        bucket.updated.result()
        source = bucket.out if bucket.out is not None else bucket.master
        slots = bucket.extra.pop("updated_slots")
        shards = [local(slot.param) for slot in slots]
        views = [slot.grad_view(source).view(shard.shape) for slot, shard in zip(slots, shards)]
        bucket.returned_event = self._transfers.write_back(shards, views)
        for slot, shard in zip(slots, shards):
            slot.param_version = shard._version
        bucket.updated = None

    def _write_back_pending(self) -> None:
        for bucket in self._pending:
            self._write_back(bucket)
        self._pending = []
        self._transfers.written_back()

    def _discard_step(self) -> None:
        """Forgets this step's gradients (a skipped step): nothing was applied."""
        self._end_step()
        for bucket in self._buckets:
            bucket.updated = None
            bucket.extra.pop("updated_slots", None)

    def _end_step(self) -> None:
        for bucket in self._buckets:
            bucket.arrived = 0
            bucket.copied_event = None
            if self.update_mode == "in_backward":
                bucket.updated = None
        for slot in self._slots.values():
            slot.final_version = None
        self._clip_coefficient = None

    # --- checkpoints and the end --------------------------------------------------------------

    def flush(self) -> None:
        """Delayed updates: writes the pending update's parameters back now."""
        self._write_back_pending()
        self._transfers.synchronize()

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
        self.flush()
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(saved_groups, self.param_groups)):
            raise ValueError("loaded state dict's parameter groups do not match this optimizer's "
                             "(group count or sizes differ)")
        for ours, saved in zip(self.param_groups, saved_groups):
            ours.update({k: v for k, v in saved.items() if k not in ("params", "fused", "foreach")})
        params = [p for g in self.param_groups for p in g["params"]]
        saved_ids = [i for g in saved_groups for i in g["params"]]
        by_param = {p: state_dict["state"].get(i) for p, i in zip(params, saved_ids)}
        for param, slot in self._slots.items():
            load_offloaded_state(slot, by_param[param])
        if self._device_optimizer is not None:
            inner_state = split_device_state(self._device_optimizer, by_param)
            self._device_optimizer.load_state_dict(inner_state)
            for param in self._device_parameters():
                if param in self._device_optimizer.state:
                    self.state[param] = self._device_optimizer.state[param]

    def host_stats(self) -> dict[str, Any]:
        """The host memory the states take (bytes, pinned or pageable), where it is placed, the
        CPUs that update it, and the time spent in host updates so far (seconds)."""
        return {**self._store.stats(), "placement": self._store.placement(),
                "update_cpus": self._worker.cpus,
                "update_threads": self._worker.threads,
                "update_seconds": self._worker.busy_seconds}

    def close(self) -> None:
        """Finishes pending updates and copies and lets go of the worker thread and hooks."""
        self.flush()
        self._worker.close()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def __del__(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            with contextlib.suppress(Exception):
                self._transfers.synchronize()
                worker._executor.shutdown(wait=True)
