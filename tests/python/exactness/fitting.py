"""How the ``fit`` feature calls ``stowage.fit``: on the cell's model, at a budget that makes it
offload optimizer states and plan the activations (the loop then uses ``fitted.optimizer`` and
``with fitted:``, features.FitSetup).

fit records a step and measures the host and device update rates each time it runs; the suite
computes both once per model (``stowage.plan.profile`` on a scratch copy, the rates once per
session) and serves them to fit while it runs. Served, the profile still runs the cell's step
once, as fit's own recording does, so whatever fit's recording does to the model (BatchNorm's
statistics, the RNG stream) happens as it would.

Contract: fit is held to torch from the model's state before fit was called: a fit that leaves
the model's buffers or a global RNG (the CPU's; on a GPU the GPU's too) changed fails the cell,
naming which. The budget is relative to what the device holds when fit runs
(``stowage.memory_allocated()``: the simulated device's, or the GPU's) and to the step's
recorded peaks on that device.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from typing import Any, Callable, Iterator

import torch

import stowage
import stowage.plan
from exactness.devices import rng_states, set_rng_states

MiB = 1 << 20


def fit_budget(profile: Any, lowest: int, trainable_bytes: int, accumulating: bool = False) -> int:
    """A budget (device bytes) where torch's optimizer with all its states cannot fit any plan
    but the states offloaded leave room for a plan that must offload or recompute: the step's
    room is at least the lowest planned peak, at most halfway to the unplanned peak and less
    than that lowest peak plus the states. `accumulating`: the profile is one micro-batch's, and
    from the second one on the gradients are on the device from its start."""
    unplanned = profile.unconstrained_peak_bytes
    states = 2 * trainable_bytes
    room = min(lowest + states // 2, (lowest + unplanned) // 2) + (trainable_bytes if accumulating else 0)
    return budget_for(room)


def budget_for(room: int) -> int:
    """The budget that leaves fit `room` usable bytes beyond what the device holds now."""
    total = stowage.memory_allocated() + room
    if (total + 16 * MiB) * 0.05 <= 16 * MiB:  # fit keeps max(5%, 16 MiB) free for rounding
        return total + 16 * MiB
    return int(total / 0.95) + 1


@contextlib.contextmanager
def served(caches: Any, spec: Any, scale: int) -> Iterator[None]:
    """While open, stowage.plan.profile (one size) runs the step once and returns this model's
    cached profile, and fit's update rates are measured once per session."""
    import stowage.fitting.fit as fit_module

    real_profile = stowage.plan.profile
    profile = caches.profile(spec, scale)

    def serve(step_fn: Any, *, sizes: Any = None, **options: Any) -> Any:
        if sizes is not None:
            return real_profile(step_fn, sizes=sizes, **options)
        step_fn()
        return profile

    patches = [(stowage.plan, "profile", serve)]
    if hasattr(fit_module, "measure_rates"):
        patches.append((fit_module, "measure_rates", caches.rates))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


Saved = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]


def _buffers_and_rng(model: Any, device: str) -> Saved:
    return {n: b.detach().clone() for n, b in model.named_buffers()}, rng_states(device)


def _changed(model: Any, before: Saved, device: str) -> str | None:
    """What fit changed of the model's buffers and the RNG streams (named), put back as it was."""
    buffers, rng = before
    changed = [n for n, b in model.named_buffers() if n in buffers and not torch.equal(b, buffers[n])]
    said = []
    if changed:
        said.append(f"buffers {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}")
    now = rng_states(device)
    moved = [name for name, state in rng.items() if not torch.equal(now[name], state)]
    if moved:
        said.append(f"the global RNG stream ({', '.join(moved)})" if device != "cpu" else "the global RNG stream")
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in buffers:
                buffer.copy_(buffers[name])
    set_rng_states(rng)
    if not said:
        return None
    return (f"stowage.fit changed {' and '.join(said)} before training began (its recording step; put back "
            "for the rest of the cell)")


def fit_model(model: Any, factory: Callable[[list[Any]], Any], example: Any, loss_fn: Any, caches: Any,
              spec: Any, scale: int, cost: dict[str, float], extra_room: int = 0, room: int | None = None,
              **options: Any) -> tuple[Any, str | None]:
    """``stowage.fit`` on `model` at `fit_budget` (plus `extra_room` bytes; or, given `room`, at
    `budget_for(room)`), its profile and rates
    served from `caches`; returns what fit returned and what it changed of the model's buffers and
    the RNG stream (put back as it was), if anything. `options` go to fit (micro_batches: the
    cached profile is then one micro-batch's)."""
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    before = _buffers_and_rng(model, spec.device)
    gc.collect()  # garbage of earlier runs, which fit's recording would collect, out of the count now
    gc.disable()  # a collection between here and fit's own count of memory in use would move the window
    try:
        if room is not None:
            budget = budget_for(room)
        elif options.get("micro_batches", 1) != 1:
            budget = fit_budget(*caches.micro_profile(spec, scale), trainable, accumulating=True)
        else:
            budget = fit_budget(caches.profile(spec, scale), caches.lowest_peak(spec, scale), trainable)
        budget += extra_room
        with served(caches, spec, scale), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = stowage.fit(model, factory, example, loss_fn=loss_fn, budget=budget, verbose=bool(os.environ.get("FITV")), cost=cost,
                                 **options)
    finally:
        gc.enable()
    return fitted, _changed(model, before, spec.device)
