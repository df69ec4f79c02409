"""Training-loop patterns, run the same way with a feature and with plain torch, and the Run
they drive (the model, the optimizer, the feature's contexts, what is recorded and when).

Contract: a pattern is a function of a Run; it trains ``run.steps`` steps through the Run's
helpers, which record the loss of every forward, the gradients once per step before anything
changes them, the parameters and buffers after each optimizer step, and each event (an expected
exception), all on the model's device (``run.spec.device``, whose bf16 autocast the autocast
pattern runs under). ``run.phase`` says where the run is (for a refusal's "first point":
"forward 2", "backward 1", "clip", "step", "between"). ``Pattern.refusal``: where
``update="in_backward"`` may refuse it (the step, as a function of the run's steps, and the
phase), None where it may not.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from exactness.compare import Trace
from exactness.features import Groups, Setup, saved_and_loaded
from exactness.interrupts import CtrlC

MAX_NORM = 0.05


class InjectedFailure(RuntimeError):
    """The failure a pattern injects into one step (a hook that raises once)."""


INPLACE_PHRASE = "modified by an inplace operation"


class Run:
    """One run of a pattern: the model, its optimizer and the feature's Setup, recording into
    `trace`."""

    def __init__(self, spec: Any, model: Any, groups: Groups, setup: Setup, trace: Trace, steps: int,
                 scale: int) -> None:
        self.spec, self.model, self.groups, self.setup, self.trace = spec, model, groups, setup, trace
        self.steps, self.scale = steps, scale
        self.params = [p for g in groups for p in g["params"]]
        self.names = {p: n for n, p in model.named_parameters()}
        self.optimizer = setup.optimizer(groups)
        self.step, self.phase = 0, "start"
        self._grads_recorded = False

    @property
    def first_event(self) -> int:
        return self.steps // 3

    @property
    def second_event(self) -> int:
        return 2 * self.steps // 3

    # --- recording ------------------------------------------------------------------------------

    def record_parameters(self, step: int) -> None:
        for p in self.params:
            self.trace.record(step, "param", self.names[p], p)

    def record_grads(self) -> None:
        if self._grads_recorded:
            return
        self._grads_recorded = True
        for p in self.params:
            self.trace.record(self.step, "grad", self.names[p], p.grad)

    def event(self, what: str) -> None:
        self.trace.record(self.step, "event", self.phase, what)

    # --- a step's parts -------------------------------------------------------------------------

    def stepping(self) -> contextlib.AbstractContextManager[Any]:
        """The feature's context around one forward and its backward."""
        return self.setup.step_context()

    def forward(self, micro: int = 0, *, autocast: bool = False) -> torch.Tensor:
        self.phase = f"forward {micro + 1}"
        batch = self.spec.batch(self.step * 4 + micro, self.scale)
        cast = torch.autocast(self.spec.device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with self.setup.forward_context(), cast:
            loss = self.spec.loss(self.model, batch)
        self.trace.record(self.step, "loss", f"forward {micro + 1}", loss)
        return loss

    def share(self, micro: int, micro_batches: int) -> float:
        """Micro-batch `micro`'s share of this step's loss units (the model's ``units``: what its
        loss averages), the weight an accumulating loop gives its loss."""
        counts = [self.spec.units(self.spec.batch(self.step * 4 + index, self.scale)) for index in range(micro_batches)]
        return counts[micro] / sum(counts)

    def backward(self, loss: torch.Tensor, micro: int = 0, **options: Any) -> None:
        self.phase = f"backward {micro + 1}"
        loss.backward(**options)

    def accumulating(self) -> contextlib.AbstractContextManager[Any]:
        marker = getattr(self.setup.loop_methods(self.optimizer), "accumulating", None)
        return marker() if marker is not None else contextlib.nullcontext()

    def optimizer_step(self, after_step: Callable[["Run"], None] | None = None) -> None:
        """The optimizer's step; `after_step` runs right after it returns, before anything reads
        the parameters (with overlap=True, while the step's host part may still be pending)."""
        self.record_grads()
        self.phase = "step"
        self.optimizer.step()
        if after_step is not None:
            self.phase = "after step"
            after_step(self)
        self.record_parameters(self.step)
        for name, buffer in self.model.named_buffers():
            self.trace.record(self.step, "buffer", name, buffer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.phase = "zero_grad"
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def next_step(self) -> None:
        self.setup.end_step()
        self.step += 1
        self.phase = "between"
        self._grads_recorded = False

    def data_written(self, params: list[torch.Tensor]) -> None:
        """Tells a delayed reference that `params` were written through ``.data``."""
        written = getattr(self.optimizer, "data_written", None)
        if written is not None:
            written(params)


Hook = Callable[[Run], None]


def train_step(run: Run, *, micro: int = 1, marked: bool = False, autocast: bool = False,
               after_backward: Hook | None = None, set_to_none: bool = True, after_step: Hook | None = None) -> None:
    """One step: `micro` forward-backward passes (each loss times its share of the step's loss
    units, a half each for a mean over rows; with `marked`, all but the last inside the
    optimizer's ``accumulating()``), `after_backward`, the optimizer's step (and `after_step`
    right after it), zero_grad."""
    for index in range(micro):
        marker = run.accumulating() if marked and index < micro - 1 else contextlib.nullcontext()
        with marker, run.stepping():
            loss = run.forward(index, autocast=autocast)
            run.backward(loss * run.share(index, micro) if micro > 1 else loss, index)
    if after_backward is not None:
        after_backward(run)
    run.optimizer_step(after_step)
    run.zero_grad(set_to_none)


def loop(run: Run, *, between: Hook | None = None, **step_options: Any) -> None:
    """The loop most patterns are: `between` (from the second step on) then a train step."""
    for _ in range(run.steps):
        if between is not None and run.step > 0:
            run.phase = "between"
            between(run)
        train_step(run, **step_options)
        run.next_step()


def at_first_event(hook: Hook) -> Hook:
    def apply(run: Run) -> None:
        if run.step == run.first_event:
            hook(run)

    return apply


# --- patterns with a step of their own ---------------------------------------------------------

def _clip_torch(run: Run) -> None:
    run.record_grads()
    run.phase = "clip"
    torch.nn.utils.clip_grad_norm_(run.params, MAX_NORM)


def _clip_optimizer(run: Run) -> None:
    run.record_grads()
    run.phase = "clip"
    clip = getattr(run.setup.loop_methods(run.optimizer), "clip_grad_norm_", None)
    if clip is not None:
        clip(MAX_NORM)
    else:
        torch.nn.utils.clip_grad_norm_(run.params, MAX_NORM)


def _scheduled(run: Run) -> None:
    scheduler = torch.optim.lr_scheduler.OneCycleLR(run.optimizer, max_lr=[5e-3] * len(run.groups),
                                                    total_steps=run.steps + 1, pct_start=0.5, cycle_momentum=True,
                                                    base_momentum=0.85, max_momentum=0.95)
    for _ in range(run.steps):
        train_step(run)
        scheduler.step()
        run.next_step()


def _edit_groups(run: Run) -> None:
    run.optimizer.param_groups[0]["lr"] *= 0.5
    run.optimizer.param_groups[-1]["weight_decay"] = 0.05


# Patterns that touch a few parameters touch the last ones: with device_fraction (fit) the first
# parameters' states stay on the device, the last ones' are offloaded.

def _freeze(model: Any, groups: Groups) -> None:
    for p in groups[0]["params"][-2:]:
        p.requires_grad_(False)


def _unfreeze(run: Run) -> None:
    run.groups[0]["params"][-1].requires_grad_(True)


def _clamp(run: Run) -> None:
    p = run.groups[0]["params"][-1]
    bound = float(p.detach().abs().max()) / 2  # weight clipping that clips
    p.data.clamp_(-bound, bound)
    run.data_written([p])


def _ema_loop(run: Run) -> None:
    ema = {p: p.detach().clone() for p in run.params}
    for _ in range(run.steps):
        if run.step == run.first_event:
            run.phase = "between"
            for p in run.params:
                p.data.copy_(ema[p])
            run.data_written(run.params)
        train_step(run)
        for p in run.params:
            ema[p].mul_(0.5).add_(p.detach(), alpha=0.5)
        run.next_step()


def _assign(run: Run) -> None:
    written = run.groups[0]["params"][-2:]
    for p in written:
        p.data = p.data * 0.9
    run.data_written(written)


def _replace_grad(run: Run) -> None:
    run.record_grads()
    p = run.groups[0]["params"][-1]
    p.grad = p.grad * 0.5


def _zero_one_grad(run: Run) -> None:
    run.record_grads()
    run.groups[0]["params"][-1].grad.zero_()


# Right after step() returns (an overlapped step's host part may still be pending: Note
# [Overlapped steps]), before the loop records anything: each parameter read (a logged norm); two
# written (one clamped through .data, one copied into); a checkpoint of the model and the optimizer
# saved and loaded back, into the model and a fresh optimizer.

def _read_after_step(run: Run) -> None:
    for p in run.params:
        run.trace.record(run.step, "param", f"{run.names[p]} (its norm read right after step())", p.detach().norm())


def _write_after_step(run: Run) -> None:
    first, last = run.params[0], run.params[-1]
    bound = float(last.detach().abs().max()) / 2
    last.data.clamp_(-bound, bound)
    with torch.no_grad():
        first.copy_(first * 0.5)
    run.data_written([first, last])


def _checkpoint_after_step(run: Run) -> None:
    saved = saved_and_loaded({"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict()})
    run.model.load_state_dict(saved["model"])
    run.data_written(run.params)  # (delayed: the model's state_dict is its parameters as last written back)
    replacement = run.setup.fresh(run.groups, run.optimizer)
    run.optimizer = None  # type: ignore[assignment]  (dropped, as a loop that replaces it does)
    replacement.load_state_dict(saved["optimizer"])
    run.optimizer = replacement


def _failing_step(run: Run, arm: Callable[[Run], Any]) -> None:
    """A step whose forward or backward raises (`arm` installs the raising hook and returns its
    handle); the loop goes on with zero_grad and the next step."""
    handle = arm(run)
    try:
        train_step(run)
    except InjectedFailure:
        run.event("InjectedFailure")
        run.zero_grad(True)
    finally:
        handle.remove()


def _raise_once(*_: Any) -> None:
    raise InjectedFailure("injected")


def _raising_loop(run: Run, arm: Callable[[Run], Any]) -> None:
    for _ in range(run.steps):
        if run.step == run.first_event:
            _failing_step(run, arm)
        else:
            train_step(run)
        run.next_step()


def _arm_forward(run: Run) -> Any:
    return run.model.get_submodule(run.spec.probe).register_forward_hook(_raise_once)


def _arm_backward(run: Run) -> Any:
    return run.params[len(run.params) // 2].register_hook(_raise_once)


def _swap(run: Run) -> None:
    """state_dict saved and loaded into a fresh optimizer of the other kind (then back)."""
    saved = saved_and_loaded(run.optimizer.state_dict())
    if run.step == run.first_event:
        replacement = run.setup.other(run.groups)
    else:
        replacement = run.setup.fresh(run.groups, run.optimizer)
    run.optimizer = None  # type: ignore[assignment]  (dropped, as a loop that replaces it does)
    replacement.load_state_dict(saved)
    run.optimizer = replacement


def _swapping_loop(run: Run) -> None:
    loop(run, between=lambda r: _swap(r) if r.step in (r.first_event, r.second_event) else None)


def _evaluate(run: Run) -> None:
    run.model.eval()
    with torch.no_grad():
        loss = run.spec.loss(run.model, run.spec.batch(9000 + run.step, run.scale))
    run.trace.record(run.step, "eval_loss", "no_grad", loss)
    run.model.train()


def _retained(run: Run) -> None:
    first = run.params[0]
    for _ in range(run.steps):
        with run.stepping():
            loss = run.forward()
            run.phase = "autograd.grad"
            (grad,) = torch.autograd.grad(loss, [first], retain_graph=True)
            run.trace.record(run.step, "autograd_grad", run.names[first], grad)
            run.backward(loss, 0, retain_graph=True)
            run.backward(loss, 1)
        run.optimizer_step()
        run.zero_grad()
        run.next_step()


def _inplace_step(run: Run) -> None:
    captured: list[torch.Tensor] = []
    handle = run.model.get_submodule(run.spec.probe).register_forward_hook(lambda m, a, out: captured.append(out))
    try:
        with run.stepping():
            loss = run.forward()
            handle.remove()
            with torch.no_grad():
                captured[0].add_(1.0)  # a tensor a later op saved, changed before backward
            try:
                run.backward(loss)
                run.event("no error")
            except RuntimeError as error:
                if INPLACE_PHRASE not in str(error):
                    raise
                run.event(f"RuntimeError: {INPLACE_PHRASE}")
    finally:
        handle.remove()
    run.zero_grad(True)


def _inplace_loop(run: Run) -> None:
    for _ in range(run.steps):
        if run.step == run.first_event:
            _inplace_step(run)
        else:
            train_step(run)
        run.next_step()


def _data_saved_step(run: Run, probe: str) -> None:
    """A forward hook keeps the output of `probe` (an activation a later op saved), and between
    forward and backward it is written through ``.data``, which bumps no version: torch's saved
    tensor aliases it, so plain torch's backward uses the written values. The reference is kept
    until backward has run."""
    captured: list[torch.Tensor] = []
    handle = run.model.get_submodule(probe).register_forward_hook(lambda m, a, out: captured.append(out))
    try:
        with run.stepping():
            loss = run.forward()
            handle.remove()
            captured[0].data.add_(0.5)
            run.backward(loss)
    finally:
        handle.remove()
    run.optimizer_step()
    run.zero_grad()


def _data_saved_loop(run: Run, probe: Callable[[Any], str]) -> None:
    for _ in range(run.steps):
        if run.step == run.first_event:
            _data_saved_step(run, probe(run.spec))
        else:
            train_step(run)
        run.next_step()


def _fitted_steps(run: Run) -> None:
    """fit's own step: ``fitted.backward`` on the global batch of the accumulate pattern's two
    micro-batches (fit cuts it into them and weights each loss by its share of the units fit's
    check verified), then the optimizer's step; the reference is the accumulate pattern (each
    loss weighted by the model's own count of its units, by hand)."""
    fitted = getattr(run.setup, "fitted", None)
    if fitted is None:
        loop(run, micro=2)
        return
    from exactness.features import global_batch

    original, forwards = fitted.loss_fn, [0]

    def recording(model: Any, batch: Any) -> torch.Tensor:
        run.phase = f"forward {forwards[0] + 1}"
        loss = original(model, batch)
        run.trace.record(run.step, "loss", run.phase, loss)
        forwards[0] += 1
        return loss

    fitted.loss_fn = recording
    try:
        for _ in range(run.steps):
            forwards[0] = 0
            fitted.backward(global_batch(run.spec, run.step, run.scale))
            run.optimizer_step()
            run.zero_grad()
            run.next_step()
    finally:
        fitted.loss_fn = original


def _hooked_loop(run: Run) -> None:
    """Post-accumulate hooks registered after the optimizer was made (so after its own hooks):
    each parameter's gradient scaled in place, given noise, or replaced (clamped), by turns."""
    handles = [p.register_post_accumulate_grad_hook(functools.partial(_edit_gradient, run, index))
               for index, p in enumerate(run.params)]
    try:
        loop(run)
    finally:
        for handle in handles:
            handle.remove()


def _edit_gradient(run: Run, index: int, param: torch.Tensor) -> None:
    if index % 3 == 0:
        param.grad.mul_(0.5)
    elif index % 3 == 1:  # noise of its own generator: the run's RNG stream is left alone
        generator = torch.Generator(param.device).manual_seed(1000 * run.step + index)
        param.grad.add_(torch.randn(param.grad.shape, generator=generator, device=param.device,
                                    dtype=param.grad.dtype), alpha=1e-3)
    else:
        param.grad = param.grad.clamp(-1e-3, 1e-3)


def _hyper_between(run: Run) -> None:
    """A scheduler (lr and beta1) stepped between backward and step(), and a group's weight
    decay set there once (a warm-up written by hand)."""
    scheduler = torch.optim.lr_scheduler.OneCycleLR(run.optimizer, max_lr=[5e-3] * len(run.groups),
                                                    total_steps=run.steps + 1, pct_start=0.5, cycle_momentum=True,
                                                    base_momentum=0.85, max_momentum=0.95)

    def between_backward_and_step(r: Run) -> None:
        scheduler.step()
        if r.step == r.first_event:
            r.optimizer.param_groups[-1]["weight_decay"] = 0.05

    loop(run, after_backward=between_backward_and_step)


@contextlib.contextmanager
def _interrupting(optimizer: Any, point: str) -> Any:
    """Ctrl-C inside the optimizer's step(): for stowage's, SIGINT as its step reaches `point`
    ("update", "write_back": the first call of the Python its C++ step calls back at each point,
    exactness.interrupts.CtrlC), or at its end if it reaches none; for torch's, KeyboardInterrupt after its update (torch does not
    hold the signal, and an update it breaks off is no reference)."""
    if not type(optimizer).__module__.startswith("stowage"):
        original = optimizer.step

        def step_then_interrupt(*args: Any, **kwargs: Any) -> Any:
            original(*args, **kwargs)
            raise KeyboardInterrupt("interrupted at the end of step()")

        optimizer.step = step_then_interrupt
        try:
            yield
        finally:
            del optimizer.step
        return
    with CtrlC(in_function="_at_point", argument=point) as ctrl_c:
        yield
    if ctrl_c.sent_at is None:
        raise KeyboardInterrupt(f"interrupted at the end of step() (no {point} point)")


def _interrupted_step(run: Run, point: str) -> None:
    """A step whose optimizer step() is interrupted (KeyboardInterrupt); the handler saves a
    checkpoint, which a fresh optimizer loads, stepping again (and checkpointing again) if the
    step was not taken."""
    with run.stepping():
        loss = run.forward()
        run.backward(loss)
    run.record_grads()
    run.phase = "step"
    try:
        with _interrupting(run.optimizer, point):
            run.optimizer.step()
    except KeyboardInterrupt:
        run.event("KeyboardInterrupt")
    saved = saved_and_loaded(run.optimizer.state_dict())
    taken = max((float(entry.get("step", 0)) for entry in saved["state"].values()), default=0.0) > run.step
    resumed = run.setup.fresh(run.groups, run.optimizer)
    run.optimizer = None  # type: ignore[assignment]  (dropped, as a loop that resumes does)
    resumed.load_state_dict(saved)
    run.optimizer = resumed
    if not taken:  # the loop steps again, and saves its checkpoint again (with the step)
        run.optimizer.step()
        run.optimizer.state_dict()
    run.record_parameters(run.step)
    for name, buffer in run.model.named_buffers():
        run.trace.record(run.step, "buffer", name, buffer)
    run.zero_grad()


def _interrupted_loop(run: Run) -> None:
    """Step() interrupted by Ctrl-C twice: as its updates are handed over (the states being
    stepped) and as its first write-back begins (every state stepped, no parameter written
    back yet; under update="delayed", the last step's update's)."""
    for _ in range(run.steps):
        if run.step in (run.first_event, run.second_event):
            _interrupted_step(run, "update" if run.step == run.first_event else "write_back")
        else:
            train_step(run)
        run.next_step()


@dataclass(frozen=True)
class Pattern:
    """A loop pattern. ``needs``: a method of the optimizer without which the pattern is the same
    as another (n/a for features stepping torch's optimizer). ``prepare``: applied to the model
    before the optimizer is made. ``swaps``: runs steps on the other kind of optimizer (held to
    the host tolerance). ``same_reference_as``: a pattern whose reference run this one shares.
    ``recompute_refusal``: where a plan recomputing a block may refuse it (Note [Selective
    recompute] in stowage/plan/recompute_modes.py), as ``refusal`` says it for in_backward."""

    name: str
    run: Callable[[Run], None]
    needs: str | None = None
    prepare: Callable[[Any, Groups], None] | None = None
    refusal: tuple[str, str] | None = None
    swaps: bool = False
    same_reference_as: str | None = None
    recompute_refusal: tuple[str, str] | None = None

    def refusal_point(self, steps: int, recomputing: bool = False) -> tuple[int, str] | None:
        """(step, phase) where update="in_backward" (or, `recomputing`, a plan's recomputation)
        may refuse this pattern, if it may."""
        refusal = self.recompute_refusal if recomputing else self.refusal
        if refusal is None:
            return None
        when, phase = refusal
        return (0 if when == "first" else steps // 3), phase


def _patterns() -> list[Pattern]:
    first = at_first_event
    return [
        Pattern("plain", loop),
        Pattern("accumulate", lambda r: loop(r, micro=2), refusal=("first", "backward 2")),
        Pattern("accumulate_marked", lambda r: loop(r, micro=2, marked=True), needs="accumulating",
                same_reference_as="accumulate"),
        Pattern("clip_torch", lambda r: loop(r, after_backward=_clip_torch), refusal=("first", "step")),
        Pattern("clip_optimizer", lambda r: loop(r, after_backward=_clip_optimizer), needs="clip_grad_norm_",
                same_reference_as="clip_torch"),
        Pattern("autocast_bf16", lambda r: loop(r, autocast=True)),
        Pattern("lr_scheduler", _scheduled),
        Pattern("param_groups", lambda r: loop(r, between=first(_edit_groups))),
        Pattern("frozen", lambda r: loop(r, between=first(_unfreeze)), prepare=_freeze),
        Pattern("data_clamp", lambda r: loop(r, between=first(_clamp))),
        Pattern("data_ema", _ema_loop),
        Pattern("data_assign", lambda r: loop(r, between=first(_assign))),
        Pattern("grad_replaced", lambda r: loop(r, after_backward=first(_replace_grad)), refusal=("event", "step")),
        Pattern("grad_zeroed", lambda r: loop(r, after_backward=first(_zero_one_grad)), refusal=("event", "step")),
        Pattern("zero_grad_keep", lambda r: loop(r, set_to_none=False)),
        Pattern("raise_forward", lambda r: _raising_loop(r, _arm_forward)),
        Pattern("raise_backward", lambda r: _raising_loop(r, _arm_backward)),
        Pattern("state_dict_swap", _swapping_loop, swaps=True),
        Pattern("eval_no_grad", lambda r: loop(r, between=_evaluate)),
        Pattern("retain_graph", _retained, refusal=("first", "backward 2")),
        Pattern("inplace_saved", _inplace_loop),
        Pattern("grad_hooks_after", _hooked_loop),
        Pattern("hyper_between", _hyper_between),
        Pattern("interrupted_step", _interrupted_loop),
        Pattern("data_saved", lambda r: _data_saved_loop(r, lambda spec: spec.probe),
                recompute_refusal=("event", "backward 1")),
        Pattern("data_saved_block", lambda r: _data_saved_loop(r, lambda spec: spec.block_probe),
                recompute_refusal=("event", "backward 1")),
        Pattern("fitted_step", _fitted_steps, same_reference_as="accumulate"),
        Pattern("read_after_step", lambda r: loop(r, after_step=_read_after_step)),
        Pattern("write_after_step", lambda r: loop(r, after_step=first(_write_after_step))),
        Pattern("checkpoint_after_step", lambda r: loop(r, after_step=first(_checkpoint_after_step))),
    ]


PATTERNS = {p.name: p for p in _patterns()}
