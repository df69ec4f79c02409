"""A plan: one decision per recorded saved tensor, and ``with plan:`` applying it to a step.

Contract: a Plan holds its lifetime trace (the keys it finds tensors by) and is applied on the thread
running the step; ``with plan:`` may be entered once at a time, for one step each time.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Iterator, Mapping

from stowage import _core
from stowage.byte_counts import byte_count
from stowage.memory import is_enabled
from stowage.offload.activation_offload import SavedTensorOffload, keep
from stowage.serving import device_index, torch_module
from stowage.plan.file_formats import PLAN, VERSION, save_document
from stowage.plan.module_frames import Frame, ModuleFrames
from stowage.plan.sizes import SizedTrace
from stowage.validation import read_json
from stowage.warning_site import outside_stowage


def solve(trace: Any, budget: int | str, *, at: Mapping[str, int] | None = None,
          exact: bool = False, to_host_bytes_per_ms: float | None = None,
          to_device_bytes_per_ms: float | None = None, prefetch_depth: int | None = None) -> Plan:
    """The fastest plan found whose predicted peak (device memory the step adds to what was in
    use when it began) fits ``budget``; the one with the lowest peak, and a warning, when none
    does. ``at``: the sizes to plan for, for a trace recorded at several (stowage.plan.sizes);
    plan for the largest step a run takes and the plan serves the smaller ones. The cost model's
    figures default to the trace's calibration; without ``prefetch_depth`` a plan that fits
    only with fewer buffers brought back ahead of use takes that depth."""
    limit = byte_count(budget)
    if limit <= 0:
        raise ValueError(f"the budget must be positive, not {budget!r}")
    if isinstance(trace, SizedTrace):
        if at is None:
            raise ValueError(f"the trace was recorded at sizes {sorted(trace.sizes)}: give the sizes to "
                             f"plan for, e.g. at={{{', '.join(repr(n) + ': ...' for n in trace.sizes)}}}")
        trace = trace.at(at)
    elif at is not None:
        raise ValueError("at= is for a profile recorded at several sizes (stowage.plan.profile(step, sizes=...))")
    overrides = {"to_host_bytes_per_ms": to_host_bytes_per_ms, "to_device_bytes_per_ms": to_device_bytes_per_ms,
                 "prefetch_depth": prefetch_depth}
    given = {name: value for name, value in overrides.items() if value is not None}
    if given:  # the plan's own cost model; the trace keeps its calibration
        cost = {name: getattr(trace.cost, name) for name in overrides} | given
        _core.check_plan_cost(cost, "stowage.plan.solve", len(trace.tensors))
        trace = trace.with_cost(_core.CostModel(**cost))
    found = _core.plan_solve(trace, limit, exact, trace.cost.prefetch_depth if prefetch_depth is not None else 0)
    plan = Plan(found.trace, found.decisions, limit)
    if not found.fits:
        warnings.warn(f"stowage.plan: no plan fits {_core.format_bytes(limit)}; the lowest peak found is "
                      f"{_core.format_bytes(found.simulation.peak_bytes)}", stacklevel=2)
    return plan


class RecomputeNotice(UserWarning):
    """A plan that recomputes is applied: the recomputed blocks' forwards run twice a step."""


_recompute_noticed = False  # the notice is given once a process
_unannounced = 0  # recompute_unannounced() contexts open


@contextlib.contextmanager
def recompute_unannounced() -> Iterator[None]:
    """Plans applied inside give no recompute notice and leave it to the next one: for a trial
    of a plan that training may not run (stowage.fitting.choosing), the notice belongs to the plan
    that training runs under."""
    global _unannounced
    _unannounced += 1
    try:
        yield
    finally:
        _unannounced -= 1


def _notice_recompute(blocks: list[str]) -> None:
    """Says once a process that recomputed blocks run their forwards again in backward, with
    whatever Python they run: torch.utils.checkpoint's recomputation does the same, silently."""
    global _recompute_noticed
    if _recompute_noticed or _unannounced:
        return
    _recompute_noticed = True
    shown = ", ".join(repr(b) for b in blocks[:3]) + (f" and {len(blocks) - 3} more" if len(blocks) > 3 else "")
    warnings.warn(
        f"stowage.plan: this plan recomputes blocks ({shown}): each runs its forward again in backward, as "
        "torch.utils.checkpoint does, so the Python in it runs twice a step: forward hooks of the modules inside "
        "it, counters, prints. What the step computes is unchanged: random draws are replayed, and buffers the "
        "forward updates in place (BatchNorm's running statistics) are updated once. Said once.",
        RecomputeNotice, stacklevel=outside_stowage())


class Plan:
    """Keep / offload / recompute per saved tensor of a lifetime trace (a stowage._core.LifetimeTrace,
    under its cost model), with its predicted outcome; its decisions checked once, when it is made."""

    def __init__(self, trace: Any, decisions: list[Any], budget: int) -> None:
        problem = _core.plan_problem(trace, decisions)
        if problem is not None:
            raise ValueError(problem)
        self.trace, self._decisions, self.budget = trace, tuple(decisions), budget
        # Its simulated outcome (a stowage._core.Simulation: peak_bytes, peak_op, step_ms, recompute_ms,
        # stall_ms, bytes_at_op) under the allocated ceiling ``with plan:`` sets at the budget.
        self.prediction = _core.plan_simulate(trace, decisions, budget)
        self.departures = _core.StepDepartures()
        self.model: Any = None  # the model given to stowage.plan.profile(model=...), if any
        self._active = False
        lookup = _core.plan_lookup(trace, decisions)  # read once: each read of a field is a new copy
        self._unit_of_save, self._kept_saves, self._offloaded = lookup.unit_of_save, lookup.kept_saves, lookup.offloaded
        self._checkpointed, self._recorded_calls = lookup.checkpointed, lookup.recorded_calls
        self._checkpointed_modules, self._regions = lookup.checkpointed_modules, trace.regions

    @property
    def decisions(self) -> list[Any]:
        """One per saved tensor, checked when the plan was made (fixed since)."""
        return list(self._decisions)

    @property
    def mismatches(self) -> list[str]:
        """Where the current (or last) step departed from the trace, each place once."""
        return self.departures.this_step

    @property
    def departed_steps(self) -> int:
        """Steps under this plan that departed from its trace (stowage._core.StepDepartures)."""
        return self.departures.departed_steps

    @property
    def predicted_peak_bytes(self) -> int:
        return int(self.prediction.peak_bytes)

    @property
    def predicted_step_ms(self) -> float:
        return float(self.prediction.step_ms)

    @property
    def fits(self) -> bool:
        return self.predicted_peak_bytes <= self.budget

    # Saving ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        save_document({"format": PLAN, "version": VERSION, "budget": self.budget,
                       "decisions": [d.name for d in self._decisions], "profile": self.trace.document()}, path)

    # Applying ----------------------------------------------------------------------------
    def __enter__(self) -> Plan:
        if self._active:
            raise RuntimeError("stowage.plan: this plan is already applied to a step")
        # What __exit__ takes down, set as each part is put in place: an error on the way in
        # takes down what was put in place and leaves the plan inactive.
        self._offloading: SavedTensorOffload | None = None
        self._frames: ModuleFrames | None = None
        self._patched: list[tuple[Any, Any]] = []
        self._ceiling = None
        self._active = True
        self.departures.begin_step()
        try:
            if self._checkpointed:
                _notice_recompute(self._checkpointed_modules)
            self._hold_to_budget(torch_module())
            self._frames = ModuleFrames(on_leave=self._left, on_root=self._found_root, root=self.model,
                                        calls=self._recorded_calls)
            self._frames.install()
            offloading = SavedTensorOffload(self._pack, min_bytes=0, max_prefetch=1 << 40,
                                       prefetch_depth=self.trace.cost.prefetch_depth)
            self._offloading = offloading.__enter__()
            self._offloader = offloading.offloader  # pack is on the hot path: one lookup, not two
        except BaseException as error:
            self.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            if self._offloading is not None:
                self._offloading.__exit__(kind, error, traceback)
            if self._frames is not None:
                self._frames.remove()
            for module, original in self._patched:
                if original is None:
                    del module.forward
                else:
                    module.forward = original
            if self._ceiling is not None:
                module = torch_module()
                module.set_allocated_ceiling(self._ceiling[1], self._ceiling[0])
        finally:
            self._offloading, self._frames, self._patched, self._ceiling = None, None, [], None
            self.__dict__.pop("_offloader", None)
            self._active = False
        if kind is None:
            warning = self.departures.end_step()
            if warning is not None:
                warnings.warn(warning, stacklevel=outside_stowage())
        elif self._checkpointed:
            from stowage.plan.recompute_modes import recompute_failure  # (torch: as in _checkpointing)

            failure = recompute_failure(error)
            if failure is not None:
                raise failure from error

    def _hold_to_budget(self, module: Any) -> None:
        """The allocator's ceiling at the budget above what is in use now (Note [Allocated ceiling]
        in allocator/caching_allocator.hpp): an allocation that would pass it first waits for the
        offloads the simulation counted as done, where the copies run late."""
        self._ceiling: tuple[int, int | None] | None = None
        if not is_enabled():
            return
        index = device_index(None)
        self._ceiling = (index, module.allocated_ceiling(index))
        in_use = int(module.memory_stats(index)["allocated_bytes.all.current"])
        module.set_allocated_ceiling(in_use + self.budget, index)

    def _left(self, frame: Frame) -> None:
        if not self._frames.stack and self._offloading is not None:  # the model's forward returned
            self._offloading.forward_ended()

    def _found_root(self, root: Any) -> None:
        if hasattr(root, "_orig_mod"):
            raise RuntimeError("stowage.plan: the model is compiled as a whole (torch.compile); its saved "
                               "tensors reach neither checkpointing nor offload until its forward ends. "
                               "Compile each block instead (after profiling).")
        by_path = {self._frames.path_of(m): m for m in root.modules()}
        for path in self._checkpointed_modules:
            module = by_path.get(path)
            if module is None:
                self.departures.note(f"no module {path!r}")
                continue
            self._patched.append((module, module.__dict__.get("forward")))
            module.forward = self._checkpointing(module, module.forward)

    def _checkpointing(self, module: Any, original: Any) -> Any:
        import torch  # (here, and recompute_modes, which imports it: stowage.plan loads without torch)
        from torch.utils.checkpoint import checkpoint

        from stowage.plan.recompute_modes import recompute_contexts

        def forward(*args: Any, **kwargs: Any) -> Any:
            frame = self._frames.top
            found = self._checkpointed.get((frame.path, frame.call)) if frame is not None else None
            if frame is None or frame.module is not module or found is None or not torch.is_grad_enabled():
                return original(*args, **kwargs)
            r, kept = found
            region = self._regions[r]
            tensors = [a for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
            inputs = region.inputs
            frame.data["inputs"] = {id(t): inputs[i] for i, t in enumerate(tensors) if i < len(inputs)}
            policy = _core.RegionPolicy(region.ops, kept, self.departures, frame.path)
            where = f"block {frame.path!r}"
            versions = [t._version for t in tensors]
            out = checkpoint(original, *args, use_reentrant=False,
                             context_fn=lambda: recompute_contexts(lambda op: policy.keep(str(op)), where), **kwargs)
            if any(t._version != v for t, v in zip(tensors, versions)):
                raise RuntimeError(
                    f"stowage.plan: {where} wrote its input in place, which the step the plan was made from did "
                    "not: recomputed in backward, it would start from the written input. Profile the step as it "
                    "runs now (stowage.plan.profile leaves such a block out of recomputation).")
            return out

        return forward

    def _pack(self, tensor: Any) -> Any:
        frame: Frame | None = self._frames.top
        if frame is not None and "inputs" in frame.data:  # a checkpointed block's inputs
            unit = frame.data["inputs"].get(id(tensor))
            return self._place(tensor, unit)
        if frame is None:
            return keep(tensor)
        save = (frame.path, frame.call, frame.saves)
        frame.saves += 1
        unit = self._unit_of_save.get(save)
        if unit is None and save not in self._kept_saves:  # a departure: offloaded, so the budget holds
            self.departures.note(f"a save in {frame.path!r} the trace does not have")
            return self._offloader.pack(tensor, frame.path)
        return self._place(tensor, unit)

    def _place(self, tensor: Any, unit: int | None) -> Any:
        if unit in self._offloaded:
            frame = self._frames.top
            return self._offloader.pack(tensor, frame.path if frame is not None else "")
        return keep(tensor)

    # Reading -----------------------------------------------------------------------------
    def bytes_by_module(self) -> dict[str, dict[str, int]]:
        """Saved bytes per decision for each module group (blocks.3.mlp.fc1 -> blocks.*.mlp)."""
        return {row.group: {"keep": row.keep, "offload": row.offload, "recompute": row.recompute}
                for row in _core.bytes_by_module(self.trace, self._decisions)}

    def outcomes(self) -> dict[str, dict[str, Any]]:
        """Predicted peak and step time of the plan and of the reference plans it is judged
        against: no change, full checkpointing, offload everything."""
        rows = [("plan", self.prediction)] + [(r.name, r.simulation) for r in _core.reference_plans(self.trace)]
        return {name: {"peak_bytes": int(s.peak_bytes), "step_ms": float(s.step_ms)} for name, s in rows}

    def __str__(self) -> str:
        f = _core.format_bytes
        lines = [f"stowage plan: budget {f(self.budget)}, {len(self._decisions)} saved tensors "
                 f"({'fits' if self.fits else 'does not fit'})", "",
                 f"{'module':<40} {'keep':>12} {'offload':>12} {'recompute':>12}"]
        for module, by in sorted(self.bytes_by_module().items()):
            lines.append(f"{module:<40} {f(by['keep']):>12} {f(by['offload']):>12} {f(by['recompute']):>12}")
        lines += ["", f"{'':<20} {'peak':>12} {'step':>12}"]
        for name, row in self.outcomes().items():
            lines.append(f"{name:<20} {f(row['peak_bytes']):>12} {row['step_ms']:>10.1f}ms")
        return "\n".join(lines)


def load(path: str | Path) -> Plan:
    """A plan saved by ``Plan.save``; InputError (a ValueError) naming the file, the field, the
    value and the bound for a file that is not one (stowage.plan.file_formats), checked whole
    before anything is built from it."""
    document = read_json(path, "a stowage plan")
    trace, decisions = _core.read_plan_file(document, str(path), PLAN)
    return Plan(trace, decisions, document["budget"])
