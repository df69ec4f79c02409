"""What `fit` returns: the training step as fitted (the optimizer, the plan, the micro-batches) for a
loop to use: ``fitted.step(batch)``, or its own forward and backward under ``with fitted:`` with
``fitted.optimizer`` (README's "Fitting a larger model").

Contract: used from the thread that trains, one step at a time (``with fitted:`` is not
re-entrant). It owns the optimizer it returns, and where fit keeps the model's blocks' parameters
on the host, the stowage.offload.parameters handle that holds them there (``close()`` puts them
back on the device); the model stays the caller's.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

import torch

from stowage import _core, step_context
from stowage.fitting.batches import LOSS_UNITS_GIVEN, BatchLayout, ExampleBatch, LossFn, LossUnits, weighted
from stowage.fitting.choosing import Option
from stowage.plan import Plan


class Fitted:
    def __init__(self, model: Any, optimizer: torch.optim.Optimizer, loss_fn: LossFn, chosen: Option,
                 options: list[Option], example: ExampleBatch, facts: dict[str, Any],
                 offloaded_parameters: Any = None) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.offloaded_parameters = offloaded_parameters  # the handle keeping the blocks' parameters on the host
        self.chosen, self.options, self.example, self.facts = chosen, options, example, facts
        plan = chosen.plan
        # A plan that keeps every tensor changes nothing: the step then runs without hooks.
        self.plan: Plan | None = plan if plan is not None and any(d != _core.Decision.keep for d in plan.decisions) else None
        if self.plan is not None:
            self.plan.model = model  # the step may call the model's blocks without its forward
        self._applied: contextlib.AbstractContextManager[Any] | None = None
        self._in_step = False  # step() says what came; __exit__ leaves that to it
        assert example.cut is not None  # fit hands over the cut it chose
        self.cut = example.cut
        self._rows_guard: Any = None

    @property
    def units(self) -> LossUnits | None:  # what a batch's loss is a mean over; None: batches run whole
        return self.example.units

    @property
    def device_fraction(self) -> float:  # the share of optimizer states on the device (1.0: the factory's)
        return self.chosen.fraction

    @property
    def parameters_on_host(self) -> bool:  # the model's blocks' parameters live on the host
        return self.offloaded_parameters is not None and not self.offloaded_parameters.closed

    def close(self) -> None:
        """Puts the blocks' parameters (and their gradients) back on the device where fit keeps
        them on the host (stowage.offload.parameters' close()); nothing otherwise. Once closed, the
        step fit planned no longer holds: fit again to train on."""
        if self.offloaded_parameters is not None and not self.offloaded_parameters.closed:
            self.offloaded_parameters.close()

    def micro_batches(self, batch: Any) -> list[tuple[Any, float]]:
        """`batch` as the micro-batches fit chose (MicroCut: a larger batch as more), each with its
        share of the batch's loss units; [(batch, 1.0)] where fit runs batches whole. ValueError,
        before anything runs, where counts the example could not tell apart weigh this batch's
        micro-batches differently (Note [Micro-batches])."""
        if self.units is None:
            return [(batch, 1.0)]
        return weighted(batch, self.cut, self.units)

    def backward(self, batch: Any) -> torch.Tensor:
        """Forward and backward of ``batch`` under the plan, as the micro-batches fit chose (all but
        the last under ``accumulating()``), each loss weighted by its share, gradients accumulated
        into ``.grad``. Returns the batch's loss, detached."""
        pieces = self.micro_batches(batch)
        total: torch.Tensor | None = None
        self._in_step = True
        try:
            for index, (piece, weight) in enumerate(pieces):
                last = index == len(pieces) - 1
                with self, (contextlib.nullcontext() if last else self.accumulating()):
                    loss = self.loss_fn(self.model, piece)
                    (loss * weight if len(pieces) > 1 else loss).backward()
                share = loss.detach() * weight if len(pieces) > 1 else loss.detach()
                total = share if total is None else total + share
        except torch.OutOfMemoryError as error:
            raise torch.OutOfMemoryError(self._out_of_memory(error, batch)) from None
        finally:
            self._in_step = False
        assert total is not None
        return total

    def step(self, batch: Any) -> torch.Tensor:
        """One training step on ``batch``: ``backward(batch)``, the optimizer's step, gradients
        released. Returns the batch's loss, detached."""
        loss = self.backward(batch)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over the optimizer's parameters, whichever optimizer fit
        chose (the offloaded one's: stowage.offload.AdamW.clip_grad_norm_). Returns the total norm."""
        clip = getattr(self.optimizer, "clip_grad_norm_", None)
        if clip is not None:
            return clip(max_norm, norm_type, error_if_nonfinite)  # type: ignore[no-any-return]
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)

    def accumulating(self) -> contextlib.AbstractContextManager[Any]:
        """Marks the micro-batches that are not a step's last: the offloaded optimizer then copies no
        gradient out until the last; torch's needs no mark. Unmarked, the same with more copies."""
        marker = getattr(self.optimizer, "accumulating", None)
        return marker() if marker is not None else contextlib.nullcontext()

    def _out_of_memory(self, error: BaseException, batch: Any = None) -> str:
        """`error`'s message, then what fit planned for and what came (planner/fit_refusals.hpp)."""
        came = None
        if batch is not None:
            try:
                came = list(BatchLayout.of(batch).sizes.items())
            except ValueError:  # no tensor with rows in it: nothing to compare
                came = []
        departed = self.plan.departed_steps if self.plan is not None else 0
        return _core.fitted_out_of_memory(str(error), list(self.example.layout.sizes.items()),
                                          self.cut if self.units is not None else None, came, departed)

    def __enter__(self) -> Fitted:
        if self._applied is not None:
            raise RuntimeError("stowage.fit: a step is already running under this fit")
        self._applied = self.plan if self.plan is not None else contextlib.nullcontext()
        self._applied.__enter__()
        if self.cut.most < self.example.rows and not self._in_step:
            # on every module (a loss method may call the model's blocks, not its forward) until
            # the first of the model's with a tensor argument
            ours = {id(module) for module in self.model.modules()}
            self._rows_guard = step_context.module_calls.subscribe(
                lambda call, args: self._refuse_more_rows(args) if id(call.module) in ours else None, compiled=True)
        return self

    def _refuse_more_rows(self, args: tuple[Any, ...]) -> None:
        """The first forward under ``with fitted:`` of more rows than a micro-batch: refused before it runs."""
        try:
            rows = BatchLayout.of(args).rows
        except ValueError:
            return
        self._rows_guard()
        self._rows_guard = None
        if rows > self.cut.most:
            raise RuntimeError(_core.more_rows_refusal(rows, self.cut))

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        applied, self._applied = self._applied, None
        assert applied is not None
        if self._rows_guard is not None:
            self._rows_guard()
            self._rows_guard = None
        applied.__exit__(kind, error, traceback)
        if isinstance(error, torch.OutOfMemoryError) and "stowage.fit planned this step" not in str(error) \
                and not self._in_step:
            raise torch.OutOfMemoryError(self._out_of_memory(error)) from None

    def __str__(self) -> str:
        """The table fit prints (planner/fit_weighing_table.hpp)."""
        plan, example = self.chosen.plan, self.example
        assert plan is not None
        return _core.fit_table([o.weighed for o in self.options], self.options.index(self.chosen),
                               plan.predicted_peak_bytes, [t.bytes for t in plan.trace.tensors],
                               _core.FitFacts(**self.facts), rows=example.rows,
                               units=example.units.name if example.units else None,
                               units_given=example.checked == LOSS_UNITS_GIVEN, checked=example.checked,
                               not_cut=example.not_cut)
