"""One cell of the matrix (feature x pattern x model): the feature's run against its plain-torch
reference, judged PASS, REFUSED (an allowed refusal, checked), N/A or FAIL with the reason; the
matrices (the default and --full); the session's caches.

Contract: a session runs on one device (``Config.device``) under ``devices.session``. In CPU
mode it enables CPU mode once (``CAPACITY``) before the first cell and keeps it on; the
"torch_allocator" reference turns stowage off for its run and on again. On a GPU stowage is
torch's CUDA allocator for the whole process (tests/gpu/python/conftest.py): the allocator cell
is n/a there, and every other cell's reference is plain torch in the same process, on the same
allocator, as in CPU mode. Every run starts from ``torch.manual_seed(SEED)`` (which seeds the
GPU's generator too): the model's weights come from the CPU's global generator, then the steps'
dropout from the device's; batches come from generators of their own. Caches are computed
before a run seeds, so they never move a run's RNG stream.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

import stowage
import stowage.plan
from exactness.compare import (FINAL, Failure, Tolerance, Trace, difference, measure_tolerance, parameters_at,
                               parameters_differ)
from exactness.devices import placed, rng_states
from exactness.features import (COST, FEATURES, VARIANTS, WEIGHT_DECAY, Env, Feature, Setup, global_batch,
                                recompute_plan, reference_setup)
from exactness.models import MODELS, ModelSpec, param_groups, spec
from exactness.patterns import PATTERNS, Pattern, Run

SEED = 0
CAPACITY = "4GiB"
PATTERN_MODEL = "gpt"
MAIN_FEATURES = ("allocator", "record.tags", "activations", "plan", "plan.recompute", "adamw.exact", "adamw.in_backward",
                 "adamw.delayed", "adamw.overlapped", "fit", "parameters", "parameters.recompute", "fit.parameters",
                 "offload.parameters+adamw")
OWN_PATTERN_FEATURES = ("fit.micro_batches",)  # each on its one pattern, on every model
OWN_MODEL_FEATURES = ("fit.parameters.auto", "fit.parameters.default")  # each on its one model (on the plain loop; every pattern in full)
VARIANT_FEATURES = ("maximize.exact", "amsgrad.exact", "adam_l2.exact", "fit.maximize", "fit.amsgrad", "fit.adam_l2")
VARIANT_PATTERNS = ("plain", "accumulate_marked", "clip_optimizer", "state_dict_swap")
ON_GPU_ALLOCATOR = ("on a GPU stowage is torch's CUDA allocator for the whole process, so there is no run on torch's "
                    "own to hold it to (every other cell's reference runs on it; its GPU behaviour: "
                    "tests/gpu/python/test_torch_cuda.py)")


@dataclass(frozen=True)
class Config:
    """The default matrix (3 steps, the smallest sizes) or the full one (6 steps, twice the sizes),
    on `device` ("cpu": CPU mode; "cuda": a GPU)."""

    full: bool = False
    device: str = "cpu"

    @property
    def steps(self) -> int:
        return 6 if self.full else 3

    @property
    def scale(self) -> int:
        return 2 if self.full else 1


@dataclass(frozen=True)
class Cell:
    feature: str
    pattern: str
    model: str

    @property
    def id(self) -> str:
        return f"{self.feature}-{self.pattern}-{self.model}"


@dataclass(frozen=True)
class Outcome:
    status: str  # "PASS", "REFUSED", "N/A", "FAIL"
    reason: str = ""


def cells(config: Config) -> list[Cell]:
    """The matrix, grouped by model and pattern (references are computed once per group).
    Default: every main feature x pattern on PATTERN_MODEL, every feature of the default x model
    on the plain loop, the optimizer variants (exact and under fit) on VARIANT_PATTERNS on
    PATTERN_MODEL. Full: every feature x pattern x model."""
    if config.full:
        chosen = [Cell(f, p, m) for m in MODELS for p in PATTERNS for f in FEATURES
                  if FEATURES[f].only_model in (None, m)]
    else:
        shared = [m for m in MODELS if m not in OWN_MODELS]  # an own model's cells are its feature's alone
        chosen = [Cell(f, p, PATTERN_MODEL) for p in PATTERNS for f in MAIN_FEATURES]
        chosen += [Cell(f, p, PATTERN_MODEL) for p in VARIANT_PATTERNS for f in VARIANT_FEATURES]
        chosen += [Cell(f, "plain", m) for m in shared if m != PATTERN_MODEL for f in MAIN_FEATURES + VARIANT_FEATURES]
        chosen += [Cell(f, FEATURES[f].only_pattern or "plain", m) for m in shared for f in OWN_PATTERN_FEATURES]
        chosen += [Cell(f, "plain", FEATURES[f].only_model) for f in OWN_MODEL_FEATURES]
    return sorted(chosen, key=lambda c: (list(MODELS).index(c.model), list(PATTERNS).index(c.pattern)))


OWN_PATTERNS = {FEATURES[f].only_pattern: f for f in OWN_PATTERN_FEATURES}
OWN_MODELS = {FEATURES[f].only_model: f for f in OWN_MODEL_FEATURES}


# --- caches --------------------------------------------------------------------------------------

class Caches:
    """Per session: each model's stowage.plan profile (recorded once, on a scratch copy), its
    plan at half the step's added peak and its lowest planned peak; fit's update rates; the
    reference runs (the last few groups') and the measured tolerances."""

    def __init__(self, config: Config, kept_references: int = 24) -> None:
        self.config = config
        self._profiles: dict[str, Any] = {}
        self._plans: dict[Any, Any] = {}
        self._lowest: dict[str, int] = {}
        self._rates: dict[Any, Any] = {}
        self._references: OrderedDict[Any, Trace] = OrderedDict()
        self._tolerances: dict[Any, Tolerance] = {}
        self._kept = kept_references

    def profile(self, model: ModelSpec, scale: int) -> Any:
        if model.name not in self._profiles:
            torch.manual_seed(SEED)
            scratch = model.build(scale)
            batch = model.batch(0, scale)

            def step() -> None:
                model.loss(scratch, batch).backward()
                scratch.zero_grad(set_to_none=True)

            self._profiles[model.name] = stowage.plan.profile(step, cost=COST, model=scratch,
                                                              device=self.config.device)
            stowage.mark_step()
        return self._profiles[model.name]

    def lowest_peak(self, model: ModelSpec, scale: int) -> int:
        if model.name not in self._lowest:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._lowest[model.name] = stowage.plan.solve(self.profile(model, scale), 1).predicted_peak_bytes
        return self._lowest[model.name]

    def micro_profile(self, model: ModelSpec, scale: int) -> tuple[Any, int]:
        """One micro-batch's profile and lowest planned peak as fit makes them for the fitted_step
        pattern (its global batch recorded at 2 and 3 rows, read at half its rows)."""
        from stowage.fitting.batches import BatchLayout
        from stowage.fitting.recording import MICRO_GRID

        key = ("micro", model.name)
        if key not in self._profiles:
            torch.manual_seed(SEED)
            scratch = model.build(scale)
            batch = global_batch(model, 0, scale)
            layout = BatchLayout.of(batch)

            def step(**sizes: int) -> None:
                model.loss(scratch, layout.at(batch, sizes)).backward()
                scratch.zero_grad(set_to_none=True)

            sized = stowage.plan.profile(step, sizes={"batch": MICRO_GRID}, cost=COST, model=scratch,
                                         device=self.config.device)
            profile = sized.at({"batch": layout.rows // 2})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._profiles[key] = (profile, stowage.plan.solve(profile, 1).predicted_peak_bytes)
            stowage.mark_step()
        return self._profiles[key]

    def plan(self, model: ModelSpec, scale: int) -> Any:
        if model.name not in self._plans:
            profile = self.profile(model, scale)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = stowage.plan.solve(profile, int(profile.unconstrained_peak_bytes * 0.5))
                if not plan.fits:  # half is below what any plan reaches: the lowest found, with room
                    plan = stowage.plan.solve(profile, int(plan.predicted_peak_bytes * 1.1))
            self._plans[model.name] = plan
        return self._plans[model.name]

    def recompute_plan(self, model: ModelSpec, scale: int) -> Any:
        key = ("recompute", model.name)
        if key not in self._plans:
            self._plans[key] = recompute_plan(self.profile(model, scale))
        return self._plans[key]

    def rates(self, device: Any, dtype: Any, optimizer: Any = None, numels: Any = None) -> Any:
        from stowage.fitting.measuring import measure_rates

        implementation = None if optimizer is None else (type(optimizer), optimizer.defaults.get("foreach"),
                                                         optimizer.defaults.get("fused"))
        key = (str(device), dtype, implementation)
        if key not in self._rates:
            self._rates[key] = measure_rates(device, dtype, optimizer, numels)
        return self._rates[key]

    def warm(self, feature: Feature, model: ModelSpec, scale: int) -> None:
        """Computes what the feature's setup will ask for, before the run seeds."""
        if feature.name.startswith(("plan", "fit", "parameters.recompute")):
            self.plan(model, scale)
            self.recompute_plan(model, scale)
            self.lowest_peak(model, scale)
        if feature.name.startswith("fit"):
            self.rates(placed(self.config.device), torch.float32)
        if feature.only_pattern == "fitted_step":
            self.micro_profile(model, scale)

    def reference(self, key: Any, make: Callable[[], Trace]) -> Trace:
        if key in self._references:
            self._references.move_to_end(key)
            return self._references[key]
        trace = make()
        self._references[key] = trace
        while len(self._references) > self._kept:
            self._references.popitem(last=False)
        return trace

    def tolerance(self, key: Any, make: Callable[[], Tolerance]) -> Tolerance:
        if key not in self._tolerances:
            self._tolerances[key] = make()
        return self._tolerances[key]


# --- runs ----------------------------------------------------------------------------------------

def _capacity() -> int | str:
    """The simulated device's capacity (CPU mode's device is per process: it is enabled again at
    the same one), CAPACITY where it cannot be read."""
    try:
        from stowage.serving import device_index, torch_module

        return int(torch_module().capacity(device_index(torch.device("cpu"))))
    except Exception:  # (a private reading: the suite's own capacity is the fallback)
        return CAPACITY


@contextlib.contextmanager
def torch_allocator() -> Iterator[None]:
    """torch's own CPU allocator for the block (stowage off), CPU mode back on after it."""
    was = stowage.is_enabled()
    capacity = _capacity() if was else CAPACITY
    if was:
        stowage.mark_step()
        stowage.disable()
    try:
        yield
    finally:
        if was:
            stowage.enable(device="cpu", capacity=capacity)


def _record_final(run: Run) -> None:
    """The end of the run: optimizer states and groups through state_dict (which writes a delayed
    update back), then parameters, buffers and the RNG streams (the CPU's; on a GPU the GPU's
    too). A state never stepped (step 0) counts as no state, as torch keeps none. States are
    compared on their parameter's device: where the optimizer keeps them (stowage's in host
    memory, torch's on a GPU) is no part of what it computes."""
    state = run.optimizer.state_dict()
    trace = run.trace
    for index, entry in state["state"].items():
        param = run.params[index]
        if float(entry.get("step", 0)) == 0:
            continue
        for key, value in entry.items():
            if key == "step":
                trace.record(FINAL, "step_count", run.names[param], float(value))
            elif key != "master" or param.dtype != torch.float32:
                on_device = value.to(param.device) if isinstance(value, torch.Tensor) else value
                trace.record(FINAL, key, run.names[param], on_device)
    for index, group in enumerate(state["param_groups"]):
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
            if key in group:
                trace.record(FINAL, "group", f"{index}.{key}", group[key])
    run.record_parameters(FINAL)
    for name, buffer in run.model.named_buffers():
        trace.record(FINAL, "buffer", name, buffer)
    for name, state in rng_states(run.spec.device).items():
        trace.record(FINAL, "rng", name, state)


def _close(*optimizers: Any) -> None:
    for optimizer in optimizers:
        close = getattr(optimizer, "close", None)
        if close is not None:
            close()


def execute(model_spec: ModelSpec, pattern: Pattern, make_setup: Callable[[Env, Any, Any], Setup],
            env: Env, steps: int) -> Trace:
    """One run of `pattern` on a fresh model from SEED under the Setup `make_setup` gives."""
    trace = Trace()
    torch.manual_seed(SEED)
    model = model_spec.build(env.scale)
    model.train()
    groups = param_groups(model, WEIGHT_DECAY)
    names = {p: n for n, p in model.named_parameters()}
    for p in (p for g in groups for p in g["params"]):
        trace.record(-1, "param", names[p], p)
    if pattern.prepare is not None:
        pattern.prepare(model, groups)
    run: Run | None = None
    setup: Setup | None = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            setup = make_setup(env, model, groups)
            run = Run(model_spec, model, groups, setup, trace, steps, env.scale)
            pattern.run(run)
            _record_final(run)
    except Exception as error:  # the feature's refusal or failure, judged by the cell
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        trace.failure = Failure(error, run.step if run else -1, run.phase if run else "setup", params)
    finally:
        trace.info["vacuous"] = setup.vacuous() if setup is not None and trace.failure is None else None
        trace.info["findings"] = setup.findings() if setup is not None else []
        _close(run.optimizer if run else None, getattr(getattr(setup, "fitted", None), "optimizer", None))
        if stowage.is_enabled():
            stowage.mark_step()
    return trace


def _reference(caches: Caches, model: ModelSpec, pattern: Pattern, variant: str, kind: str,
               implementation: str | None = None) -> Trace:
    config = caches.config
    key = (model.name, pattern.same_reference_as or pattern.name, variant, kind, implementation)
    options = {implementation: True} if implementation else None  # (the reference itself: foreach)

    def make() -> Trace:
        setup = reference_setup(kind, VARIANTS[variant], options)
        env = Env(model, caches, config.scale)
        context = torch_allocator() if kind == "torch_allocator" else contextlib.nullcontext()
        with context:
            return execute(model, pattern, lambda e, m, g: setup, env, config.steps)

    return caches.reference(key, make)


def _tolerance(caches: Caches, model: ModelSpec, pattern: Pattern, variant: str, kind: str) -> Tolerance:
    kind = "delayed" if kind == "delayed" else "stowage_allocator"
    key = (model.name, pattern.same_reference_as or pattern.name, variant, kind)
    return caches.tolerance(key, lambda: measure_tolerance(_reference(caches, model, pattern, variant, kind, "fused"),
                                                           _reference(caches, model, pattern, variant, kind)))


def _error_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


RECOMPUTE_REFUSAL = "is recomputed in backward"


def judge_refusal(feature: Feature, pattern: Pattern, failure: Failure, reference: Trace,
                  tolerance: Tolerance | None, steps: int) -> Outcome:
    """An exception in the feature's run: an allowed refusal when update="in_backward" refuses a
    pattern it may refuse, naming in_backward, or a plan (plan and fit features) refuses one its
    recomputation may, naming the block recomputed; either at the pattern's first visible point,
    with the parameters still the reference's there. Anything else fails."""
    said = f"{_error_line(failure.error)} (step {failure.step}, {failure.phase})"
    if feature.name.endswith("in_backward"):
        point, named = pattern.refusal_point(steps), "in_backward"
    elif feature.name.startswith(("plan", "fit")) or feature.name == "parameters.recompute":
        point, named = pattern.refusal_point(steps, recomputing=True), RECOMPUTE_REFUSAL
    else:
        point, named = None, ""
    if point is None or failure.phase == "setup":
        return Outcome("FAIL", f"raised {said}")
    if named not in str(failure.error):
        return Outcome("FAIL", f"refused without naming {named!r}: {said}")
    if (failure.step, failure.phase) != point:
        return Outcome("FAIL", f"refused at step {failure.step}, {failure.phase}; the pattern is first visible "
                               f"at step {point[0]}, {point[1]}: {said}")
    differs = parameters_differ(failure.params, parameters_at(reference, failure.step), tolerance)
    if differs:
        return Outcome("FAIL", f"refused, but the parameters already differ from torch's: {differs}: {said}")
    return Outcome("REFUSED", _error_line(failure.error))


def _nothing_to_plan(caches: Caches, feature: Feature, model: ModelSpec, scale: int) -> str | None:
    """Why the budget-driven cells (plan, fit) cannot be exercised on this model and device: no
    plan lowers its step's peak (on a GPU, cuDNN's fused LSTM keeps what a plan could move live
    through the step's peak), so no budget makes a plan act. None where one does."""
    if feature.name != "plan" and not feature.name.startswith("fit"):
        return None
    unplanned = caches.profile(model, scale).unconstrained_peak_bytes
    lowest = caches.lowest_peak(model, scale)
    if lowest < unplanned:
        return None
    return (f"no plan lowers this step's peak on this device (lowest planned {lowest:,} B, unplanned "
            f"{unplanned:,} B): no budget makes a plan act")


def run_cell(cell: Cell, caches: Caches) -> Outcome:
    """Runs and judges one cell."""
    config = caches.config
    feature, pattern, model = FEATURES[cell.feature], PATTERNS[cell.pattern], spec(cell.model, config.device)
    if feature.reference == "torch_allocator" and config.device != "cpu":
        return Outcome("N/A", ON_GPU_ALLOCATOR)
    if feature.only_pattern is not None and pattern.name != feature.only_pattern:
        return Outcome("N/A", f"{feature.name} is a loop of its own (the {feature.only_pattern} pattern)")
    if feature.only_model is not None and model.name != feature.only_model:
        return Outcome("N/A", f"{feature.name} is shown on the {feature.only_model} model alone")
    if pattern.name in OWN_PATTERNS and feature.name != OWN_PATTERNS[pattern.name]:
        return Outcome("N/A", f"the {pattern.name} pattern is {OWN_PATTERNS[pattern.name]}'s loop")
    if pattern.needs is not None and feature.own == "torch":
        return Outcome("N/A", f"torch's optimizer has no {pattern.needs}(): the cell is {pattern.same_reference_as}")
    reference = _reference(caches, model, pattern, feature.variant, feature.reference)
    if reference.failure is not None:
        return Outcome("FAIL", f"the reference run raised {_error_line(reference.failure.error)} (a suite error)")
    host = feature.host or pattern.swaps or (feature.host_on_gpu and config.device != "cpu")
    tolerance = _tolerance(caches, model, pattern, feature.variant, feature.reference) if host else None
    caches.warm(feature, model, config.scale)
    unplannable = _nothing_to_plan(caches, feature, model, config.scale)
    if unplannable is not None:
        return Outcome("N/A", unplannable)
    ours = execute(model, pattern, feature.setup, Env(model, caches, config.scale), config.steps)
    findings = list(ours.info.get("findings", []))
    if ours.failure is not None:
        outcome = judge_refusal(feature, pattern, ours.failure, reference, tolerance, config.steps)
    elif ours.info.get("vacuous"):
        outcome = Outcome("FAIL", ours.info["vacuous"])
    else:
        differs = difference(ours, reference, tolerance)
        outcome = Outcome("PASS") if differs is None else Outcome("FAIL", differs)
    if not findings:
        return outcome
    then = f"; then: {outcome.status} {outcome.reason}".rstrip() if outcome.status != "PASS" else "; otherwise PASS"
    return Outcome("FAIL", "; ".join(findings) + then)
