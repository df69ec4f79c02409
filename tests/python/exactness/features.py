"""The features under test, each an adapter of a few lines (a Setup: the loop's optimizer and
the contexts a step runs under), the optimizers they use, and the references they are held to.

Contract: a Feature's ``setup(env, model, groups)`` is called once per run, after the model is
built and the pattern has prepared it, and returns a Setup the pattern's loop drives: its
optimizer for ``groups``, a fresh one of the same kind and one of the other kind (torch <->
stowage, for a state_dict moved between them), the context around each forward and backward
(``step_context``) and around each forward (``forward_context``), what ends a step, and after
the run whether the feature did anything at all (``vacuous``). New features add a Setup and one
line in FEATURES.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

import stowage
import stowage.plan
from stowage.fitting.measuring import measure_blocks
from exactness.fitting import fit_model

HYPER: dict[str, Any] = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
WEIGHT_DECAY = 0.1
COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}
Groups = list[dict[str, Any]]


@dataclass(frozen=True)
class Variant:
    """An optimizer of torch (``torch.optim.<kind>`` with ``options``) and its offloaded twin
    (``stowage.offload.<kind>``, the same constructor plus ``update=``)."""

    name: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def torch(self, groups: Groups, **implementation: Any) -> torch.optim.Optimizer:
        """torch's optimizer, foreach=True unless told otherwise (fused=True measures the tolerance)."""
        implementation = implementation or {"foreach": True}
        return getattr(torch.optim, self.kind)(copy_groups(groups), **HYPER, **self.options, **implementation)

    def stowage(self, groups: Groups, update: str = "exact", **options: Any) -> torch.optim.Optimizer:
        # Buckets of 4096 elements: the models' parameters fill several, so that update="exact"
        # streams them through its staging ring's three slots (Note [Staged buckets]).
        return getattr(stowage.offload, self.kind)(copy_groups(groups), **HYPER, **self.options, update=update,
                                                   bucket_numel=BUCKET_NUMEL, **options)


BUCKET_NUMEL = 4096

VARIANTS = {v.name: v for v in (Variant("adamw", "AdamW"), Variant("maximize", "AdamW", {"maximize": True}),
                                Variant("amsgrad", "AdamW", {"amsgrad": True}), Variant("adam_l2", "Adam"))}


def copy_groups(groups: Groups) -> Groups:
    return [{**g, "params": list(g["params"])} for g in groups]


def saved_and_loaded(state: dict[str, Any]) -> dict[str, Any]:
    """A state_dict as a checkpoint gives it back: through torch.save and torch.load."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    kind = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
    return torch.equal(a.detach().reshape(-1).view(kind), b.detach().reshape(-1).view(kind))


class DelayedReference(torch.optim.Optimizer):
    """torch's optimizer with the parameters one update behind, the meaning of
    ``update="delayed"``: masters W (copies of the model's parameters M) take the steps; each
    step() first writes the previous update back (M <- W), then hands this step's gradients to W
    and steps it (pending until the next step, a state_dict or ``flush``). ``data_written``: a
    ``.data`` write to M between steps that changes its bytes wins (W takes it, the pending update
    for it is dropped; the moments keep it); one that leaves its bytes as they were is no write."""

    def __init__(self, make: Callable[[Groups], torch.optim.Optimizer], groups: Groups) -> None:
        self.visible = [p for g in groups for p in g["params"]]
        self.masters = {p: torch.nn.Parameter(p.detach().clone()) for p in self.visible}
        self.inner = make([{**g, "params": [self.masters[p] for p in g["params"]]} for g in groups])
        self.param_groups, self.defaults, self.state = self.inner.param_groups, self.inner.defaults, self.inner.state
        self._pending = False
        self._shown = {p: p.detach().clone() for p in self.visible}  # M as the last write-back left it

    def flush(self) -> None:
        if self._pending:
            with torch.no_grad():
                for p in self.visible:
                    p.copy_(self.masters[p])
                    self._shown[p] = p.detach().clone()
        self._pending = False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.flush()
        for p in self.visible:
            self.masters[p].grad = p.grad
        self.inner.step()
        self._pending = True
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.visible:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().requires_grad_(False)
                p.grad.zero_()
        for w in self.masters.values():
            w.grad = None

    def data_written(self, params: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p in params:
                if not _same_bits(p, self._shown[p]):
                    self.masters[p].copy_(p)

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)


# --- the setups ---------------------------------------------------------------------------------

@dataclass
class Env:
    """What a run's Setup may use: the model's spec, the session's caches (profiles, plans, fit's
    update rates; cells.Caches) and the size scale."""

    spec: Any
    caches: Any
    scale: int


class Setup:
    """A run with plain torch: torch's optimizer, no contexts (also the base of the others)."""

    def __init__(self, variant: Variant, implementation: dict[str, Any] | None = None,
                 other_is_stowage: bool = False) -> None:
        self.variant, self.implementation, self.other_is_stowage = variant, implementation or {}, other_is_stowage

    def optimizer(self, groups: Groups) -> torch.optim.Optimizer:
        return self.variant.torch(groups, **self.implementation)

    def fresh(self, groups: Groups, current: Any) -> torch.optim.Optimizer:
        return self.optimizer(groups)

    def other(self, groups: Groups) -> torch.optim.Optimizer:
        if self.other_is_stowage:
            return self.variant.stowage(groups)
        return self.variant.torch(groups, **self.implementation)

    def step_context(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def loop_methods(self, optimizer: Any) -> Any:
        """What the loop calls ``accumulating()`` and ``clip_grad_norm_`` on: the optimizer."""
        return optimizer

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def end_step(self) -> None:
        if stowage.is_enabled():
            stowage.mark_step()

    def vacuous(self) -> str | None:
        return None

    def findings(self) -> list[str]:
        """Differences the feature made outside the loop (the run goes on without them)."""
        return []


class DelayedSetup(Setup):
    def optimizer(self, groups: Groups) -> torch.optim.Optimizer:
        return DelayedReference(lambda g: self.variant.torch(g, **self.implementation), groups)


class StowageSetup(Setup):
    """stowage's offloaded optimizer (``update``); the other kind is torch's."""

    def __init__(self, variant: Variant, update: str) -> None:
        super().__init__(variant)
        self.update = update

    def optimizer(self, groups: Groups) -> torch.optim.Optimizer:
        return self.variant.stowage(groups, self.update)


class OverlappedSetup(StowageSetup):
    """stowage's offloaded optimizer with update="exact" and overlap=True: step() returns with its
    host part pending (Note [Overlapped steps]); vacuous when no step() returned so."""

    def __init__(self, variant: Variant) -> None:
        super().__init__(variant, "exact")
        self.made: list[Any] = []

    def optimizer(self, groups: Groups) -> torch.optim.Optimizer:
        made = self.variant.stowage(groups, "exact", overlap=True)
        self.made.append(made)
        return made

    def vacuous(self) -> str | None:
        return None if any(o._steps_started for o in self.made) else "no step() returned with its update pending"


class ActivationsSetup(Setup):
    """``stowage.offload.activations(min_bytes=0)`` around each forward."""

    def __init__(self, variant: Variant) -> None:
        super().__init__(variant, other_is_stowage=True)
        self.offloaded = 0

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        with stowage.offload.activations(min_bytes=0) as report:
            yield
        self.offloaded += report.offloaded_bytes

    def vacuous(self) -> str | None:
        return None if self.offloaded else "nothing was offloaded"


class Recomputations:
    """Counts module forwards run inside backward (a checkpoint's recomputation) while open."""

    def __init__(self) -> None:
        self.count = 0
        self._handle: Any = None

    def _entered(self, module: Any, args: Any) -> None:
        if torch._C._current_graph_task_id() != -1:
            self.count += 1

    def __enter__(self) -> Recomputations:
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._entered)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()


def _offloads() -> int:
    return int(stowage.offload.stats().get("offload.num_offloads", 0))


class PlanSetup(Setup):
    """``with plan:`` around each forward and backward, the plan solved for this model at half
    of its step's added peak (cached)."""

    def __init__(self, variant: Variant, plan: stowage.plan.Plan, model: Any) -> None:
        super().__init__(variant, other_is_stowage=True)
        self.plan = plan
        self.plan.model = model
        self.recomputed, self.offloads = 0, 0

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        before = _offloads()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a step that differs from the profiled one is said once
            with Recomputations() as recomputations, self.plan:
                try:
                    yield
                finally:
                    self.recomputed += recomputations.count
        self.offloads += _offloads() - before

    def vacuous(self) -> str | None:
        return None if self.recomputed or self.offloads else "the plan neither recomputed nor offloaded anything"


def plan_setup(env: Env, model: Any, groups: Groups, variant: Variant, recompute: bool = False) -> Setup:
    plan = env.caches.recompute_plan(env.spec, env.scale) if recompute else env.caches.plan(env.spec, env.scale)
    return PlanSetup(variant, plan, model)


def recompute_plan(profile: Any) -> stowage.plan.Plan:
    """Every tensor that can be recomputed recomputed (the blocks under selective checkpointing),
    every other one outside those blocks that can be offloaded offloaded: both of the plan's
    mechanisms at once (a recomputed block keeps what it does not recompute)."""
    recomputed = {t.region for t in profile.tensors if t.recomputable}
    keep, offload, recompute = stowage.plan.Decision.keep, stowage.plan.Decision.offload, stowage.plan.Decision.recompute
    decisions = [recompute if t.recomputable else keep if t.region in recomputed and t.region >= 0
                 else offload if t.offloadable else keep for t in profile.tensors]
    return stowage.plan.Plan(profile, decisions, profile.unconstrained_peak_bytes)


class FitSetup(Setup):
    """The loop under ``stowage.fit``: its optimizer, ``with fitted:`` around forward and backward."""

    def __init__(self, variant: Variant, fitted: Any, changed: str | None, micro_batches: int = 1) -> None:
        super().__init__(variant)
        self.fitted, self.changed, self.micro_batches = fitted, changed, micro_batches

    def optimizer(self, groups: Groups) -> torch.optim.Optimizer:
        return self.fitted.optimizer

    def fresh(self, groups: Groups, current: Any) -> torch.optim.Optimizer:
        """A fresh optimizer of the kind fit chose (for a state_dict loaded back)."""
        chosen = self.fitted.optimizer
        if type(chosen).__module__.startswith("stowage"):
            return type(chosen)(copy_groups(chosen.param_groups), update=chosen.update_mode,
                                device_fraction=chosen.device_fraction)
        return type(chosen)(copy_groups(chosen.param_groups))

    def step_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.fitted

    def loop_methods(self, optimizer: Any) -> Any:
        """fit's own: the same loop whichever optimizer it chose."""
        return self.fitted

    def findings(self) -> list[str]:
        return [self.changed] if self.changed else []

    def vacuous(self) -> str | None:
        if self.fitted.chosen.micro_batches != self.micro_batches:
            return f"fit ran {self.fitted.chosen.micro_batches} micro-batches a step, not {self.micro_batches}"
        if self.fitted.device_fraction >= 1.0 or self.fitted.plan is None:
            return (f"fit kept {self.fitted.device_fraction:.0%} of the states on the device and "
                    f"{'no' if self.fitted.plan is None else 'a'} plan: the budget did not make it offload and plan")
        return None


def fit_setup(env: Env, model: Any, groups: Groups, variant: Variant) -> Setup:
    """stowage.fit with the variant's torch optimizer as the factory, the model's first batch as
    the example and its loss."""
    example = env.spec.batch(0, env.scale)  # (made before the budget: it is on the device)
    fitted, changed = fit_model(model, lambda params: variant.torch(groups), example, env.spec.loss, env.caches,
                                env.spec, env.scale, COST)
    return FitSetup(variant, fitted, changed)


class FitParametersSetup(FitSetup):
    """The loop under ``stowage.fit`` keeping the model's blocks' parameters on the host (fit's
    ``offload_parameters=True``), its handle closed (``fitted.close()``) once the run ends."""

    def vacuous(self) -> str | None:
        if not self.fitted.parameters_on_host:
            return "fit kept the blocks' parameters on the device"
        if self.fitted.offloaded_parameters.peak_resident_bytes == 0:
            return "no offloaded parameter came in"
        return None

    def findings(self) -> list[str]:
        self.fitted.close()
        return super().findings()


def fit_parameters_setup(env: Env, model: Any, groups: Groups, variant: Variant) -> Setup:
    """stowage.fit told to keep the blocks' parameters on the host (offload_parameters=True), at
    fit's budget with room for the window of copies (at most every block's parameters twice and
    their gradients: on the suite's models of two or three blocks it is most of them). ("auto"
    choosing them there is fit.parameters.auto's, on a model deep enough that a budget leaves the
    host option alone.)"""
    example = env.spec.batch(0, env.scale)
    window = 3 * measure_blocks(model).parameter_bytes
    fitted, changed = fit_model(model, lambda params: variant.torch(groups), example, env.spec.loss, env.caches,
                                env.spec, env.scale, COST, extra_room=window, offload_parameters=True)
    return FitParametersSetup(variant, fitted, changed)


def fit_auto_parameters_setup(env: Env, model: Any, groups: Groups, variant: Variant,
                              placement: str | None = "auto") -> Setup:
    """stowage.fit choosing where the blocks' parameters live (offload_parameters="auto", or None,
    fit's default, which weighs the host only where nothing fits on the device), torch's
    optimizer whole on the device (offload_optimizer=False), at a budget half the blocks'
    parameters short of what the parameters on the device need: the states and the step's lowest
    planned peak beside what is in use. With the blocks' parameters on the host the device holds a
    window of a few blocks' (how many ahead fit weighs: Note [Parameter prefetch depth]), so that
    option alone fits, and fit must take it (FitParametersSetup.vacuous)."""
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    room = 2 * trainable + env.caches.lowest_peak(env.spec, env.scale) - measure_blocks(model).parameter_bytes // 2
    fitted, changed = fit_model(model, lambda params: variant.torch(groups), env.spec.batch(0, env.scale),
                                env.spec.loss, env.caches, env.spec, env.scale, COST, room=room,
                                offload_parameters=placement, offload_optimizer=False)
    return FitParametersSetup(variant, fitted, changed)


def global_batch(spec: Any, step: int, scale: int) -> Any:
    """The batch of the accumulate pattern's two micro-batches of `step`, rows of the first then
    the second's (fitted.step cuts it back into the same two)."""
    parts = [spec.batch(step * 4 + micro, scale) for micro in range(2)]
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return tuple(torch.cat(pieces) for pieces in zip(*parts))


def fit_micro_setup(env: Env, model: Any, groups: Groups, variant: Variant) -> Setup:
    """stowage.fit told to run the global batch as 2 micro-batches (each the accumulate pattern's
    micro-batch; BatchNorm allowed to see each alone, as that pattern's torch loop does), the
    loss's units found by fit's check (told only where the check must refuse: ModelSpec)."""
    example = global_batch(env.spec, 0, env.scale)
    told = {"loss_units": env.spec.fit_loss_units} if env.spec.fit_loss_units else {}
    fitted, changed = fit_model(model, lambda params: variant.torch(groups), example, env.spec.loss, env.caches,
                                env.spec, env.scale, COST, micro_batches=2, split_batchnorm=True, **told)
    return FitSetup(variant, fitted, changed, micro_batches=2)


class RecordSetup(Setup):
    """``stowage.record_history(True)`` (with its tags: stowage.tagging's module, optimizer and
    saved-tensor hooks) from the setup to the end of the run, its snapshot taken there."""

    def __init__(self, variant: Variant, device: str) -> None:
        super().__init__(variant, other_is_stowage=True)
        stowage.record_history(True)
        self.recording, self.device = True, device

    def vacuous(self) -> str | None:
        if self.device != "cpu":  # on a GPU torch keeps the history (stowage's tags need stowage's)
            self.findings()
            return None
        tags = stowage.snapshot().get("stowage_tags", {}).get("0", {})
        categories = {tags["categories"][c] for c in tags.get("category", []) if c >= 0}
        self.findings()
        missing = {"gradients", "optimizer states", "activations"} - categories
        return f"nothing was tagged as {', '.join(sorted(missing))}" if missing else None

    def findings(self) -> list[str]:
        if self.recording:
            self.recording = False
            stowage.record_history(False)
        return []


class ParametersSetup(Setup):
    """``stowage.offload.parameters(model)`` for the whole run (the model's blocks' parameters in
    host memory, each block's brought in as it runs), torch's optimizer stepping them there;
    around it another feature's Setup (``inner``: a plan recomputing every block), if any."""

    def __init__(self, variant: Variant, model: Any, inner: Setup | None = None) -> None:
        super().__init__(variant)
        self.inner = inner
        self.handle = stowage.offload.parameters(model)

    def step_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.inner.step_context() if self.inner is not None else contextlib.nullcontext()

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.inner.forward_context() if self.inner is not None else contextlib.nullcontext()

    def vacuous(self) -> str | None:
        if self.handle.peak_resident_bytes == 0:
            return "no offloaded parameter came in"
        return self.inner.vacuous() if self.inner is not None else None

    def findings(self) -> list[str]:
        self.handle.close()
        return self.inner.findings() if self.inner is not None else []


def parameters_setup(env: Env, model: Any, groups: Groups, variant: Variant, recompute: bool = False) -> Setup:
    inner = plan_setup(env, model, groups, variant, recompute=True) if recompute else None
    return ParametersSetup(variant, model, inner)


class ParametersAdamSetup(ParametersSetup):
    """``stowage.offload.parameters(model)`` with stowage's offloaded optimizer (update="exact"):
    the blocks' parameters updated where they live by the host kernel, the rest staged."""

    def optimizer(self, groups: Groups) -> torch.optim.Optimizer:
        return self.variant.stowage(groups)


FeatureSetup = Callable[[Env, Any, Groups], Setup]


@dataclass(frozen=True)
class Feature:
    """A cell's feature. ``reference``: the run it is held to ("torch_allocator": stowage off,
    only in CPU mode; "stowage_allocator": plain torch in the same process, stowage the device's
    allocator (CPU mode's simulated device, or torch's CUDA allocator on a GPU, where it is for the
    whole process); "delayed": DelayedReference, on stowage's allocator). ``own``: whose optimizer
    the loop steps ("torch" or "stowage"; patterns that need a method of stowage's are n/a where
    it is torch's). ``host``: compared within the measured tolerance, not bitwise (``host_on_gpu``: so on
    a GPU only, where torch's optimizer steps parameters kept on the host with its CPU kernels)."""

    name: str
    variant: str
    reference: str
    own: str
    host: bool
    setup: FeatureSetup
    only_pattern: str | None = None  # the one pattern the feature's loop is (n/a on the others)
    only_model: str | None = None  # the one model the feature is shown on (n/a on the others)
    host_on_gpu: bool = False  # on a GPU its optimizer steps on the host (held to the tolerance there)


def _features() -> dict[str, Feature]:
    out: list[Feature] = []
    adamw = VARIANTS["adamw"]
    out.append(Feature("allocator", "adamw", "torch_allocator", "torch", False,
                       lambda env, model, groups: Setup(adamw, other_is_stowage=True)))
    out.append(Feature("activations", "adamw", "stowage_allocator", "torch", False,
                       lambda env, model, groups: ActivationsSetup(adamw)))
    out.append(Feature("record.tags", "adamw", "stowage_allocator", "torch", False,
                       lambda env, model, groups: RecordSetup(adamw, env.spec.device)))
    out.append(Feature("plan", "adamw", "stowage_allocator", "torch", False,
                       lambda env, model, groups: plan_setup(env, model, groups, adamw)))
    out.append(Feature("plan.recompute", "adamw", "stowage_allocator", "torch", False,
                       lambda env, model, groups: plan_setup(env, model, groups, adamw, recompute=True)))
    for variant in VARIANTS.values():
        prefix = variant.name
        for update in ("exact", "in_backward", "delayed"):
            reference = "delayed" if update == "delayed" else "stowage_allocator"
            out.append(Feature(f"{prefix}.{update}", variant.name, reference, "stowage", True,
                               lambda env, model, groups, v=variant, u=update: StowageSetup(v, u)))
        name = "fit" if variant.name == "adamw" else f"fit.{variant.name}"
        out.append(Feature(name, variant.name, "stowage_allocator", "stowage", True,
                           lambda env, model, groups, v=variant: fit_setup(env, model, groups, v)))
    out.append(Feature("adamw.overlapped", "adamw", "stowage_allocator", "stowage", True,
                       lambda env, model, groups: OverlappedSetup(adamw)))
    out.append(Feature("parameters", "adamw", "stowage_allocator", "torch", False,
                       lambda env, model, groups: parameters_setup(env, model, groups, adamw), host_on_gpu=True))
    out.append(Feature("parameters.recompute", "adamw", "stowage_allocator", "torch", False,
                       lambda env, model, groups: parameters_setup(env, model, groups, adamw, recompute=True),
                       host_on_gpu=True))
    out.append(Feature("offload.parameters+adamw", "adamw", "stowage_allocator", "stowage", False,
                       lambda env, model, groups: ParametersAdamSetup(adamw, model), host_on_gpu=True))
    # fit runs the offloaded twin over the blocks' parameters on the host (its host kernel)
    out.append(Feature("fit.parameters", "adamw", "stowage_allocator", "stowage", False,
                       lambda env, model, groups: fit_parameters_setup(env, model, groups, adamw),
                       host_on_gpu=True))
    out.append(Feature("fit.parameters.auto", "adamw", "stowage_allocator", "torch", False,
                       lambda env, model, groups: fit_auto_parameters_setup(env, model, groups, adamw),
                       host_on_gpu=True, only_model="deep"))
    out.append(Feature("fit.parameters.default", "adamw", "stowage_allocator", "torch", False,
                       lambda env, model, groups: fit_auto_parameters_setup(env, model, groups, adamw, None),
                       host_on_gpu=True, only_model="deep"))
    out.append(Feature("fit.micro_batches", "adamw", "stowage_allocator", "stowage", True,
                       lambda env, model, groups: fit_micro_setup(env, model, groups, adamw), "fitted_step"))
    return {f.name: f for f in out}


FEATURES = _features()


def reference_setup(kind: str, variant: Variant, implementation: dict[str, Any] | None = None) -> Setup:
    """The plain-torch run a feature is held to (or, with ``fused``/``foreach``, one of the two
    that measure the tolerance)."""
    if kind == "delayed":
        return DelayedSetup(variant, implementation)
    return Setup(variant, implementation)
