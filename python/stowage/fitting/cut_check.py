"""Whether cutting the example batch keeps its step: the check behind every cut fit takes
(Note [Micro-batches] in stowage.fitting.micro_batches).

A cut is verified on the example batch itself, on every row: the loss of the whole batch
(forward only, without a graph) against its micro-batches' losses weighted by their shares of a
count the batch's tensors offer (stowage.fitting.loss_units; planner/loss_units.hpp judges which
hold); the two agree within the rounding measured on the step itself, relative to the losses'
magnitude (`NOISE_MARGIN`). Where the
whole batch's forward runs out of memory, the micro-batches are checked in spans (as many
consecutive micro-batches as a forward holds, at least two): each span's loss against its
micro-batches', which verifies the cut inside every span but not how the spans add up, which is
said; a cut whose two micro-batches do not fit in one forward cannot be checked and is refused.

The forwards run in the model's own mode under CutCheckDispatch (dropout keeps everything; batch norm
watched), each from the same state: buffers, module modes and the random generators are put
back after each (stowage.fitting.side_effects.untouched), so nothing the check runs reaches
training.

Contract: one CutCheck per example batch; `verify` may be called for several cuts, each loss
computed once; not thread-safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from stowage._core import MicroCut, judge_loss_units
from stowage.fitting.batches import LossFn, LossFnNeeded
from stowage.fitting.cut_check_dispatch import CutCheckDispatch
from stowage.fitting.loss_units import LossUnits, candidates
from stowage.fitting.micro_batches import ExampleBatch
from stowage.fitting.side_effects import untouched

# The relative difference between the whole batch's loss and its micro-batches' weighted sum
# taken as rounding: measured on the step itself (`_noise`: a micro-batch's loss against the loss
# of the same rows repeated to the whole batch's size, equal for any mean whatever its units, so
# what differs is what kernels blocked for another row count and sums taken in another order
# change), NOISE_MARGIN times over; at least what the loss's own dtype rounds (FLOOR), at most
# what the least precise dtype the forwards made rounds (CEILING; tf32 where a GPU's float32
# matmuls or convolutions may use it), and CEILING where nothing was measured.
NOISE_MARGIN = 16
FLOOR = {torch.float64: 1e-13, torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
CEILING = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


class Unverifiable(Exception):
    """The check could not run (a forward of two micro-batches does not fit, a forward raised)."""


@dataclass
class _Equations:
    """One cut's equations: for each span (consecutive micro-batches), its loss and its pieces'."""

    pieces: list[Any]
    losses: list[float]
    spans: list[tuple[int, int, float]] = field(default_factory=list)  # first piece, end piece, the span's loss


class CutCheck:
    """The check on one example batch: `verify` a list of cuts (their losses computed once and
    kept), `mixing` alone where the caller gives the units. Owns nothing of the model's: every
    forward leaves it as it found it."""

    def __init__(self, model: Any, loss_fn: LossFn, example: ExampleBatch, device: torch.device,
                 split_batchnorm: bool) -> None:
        self.model, self.loss_fn, self.device, self.example = model, loss_fn, device, example
        self.batch, self.layout, self.rows = example.batch, example.layout, example.rows
        self.mode = CutCheckDispatch(model, neutralise_batch_norm=split_batchnorm)
        self.candidates = candidates(example.batch, example.layout)
        self._losses: dict[tuple[int, int], float] = {}
        self._out_of_memory_at = self.rows + 1  # the fewest rows a forward ran out of memory at
        self._verified: list[tuple[MicroCut, _Equations]] = []
        self._loss_dtype = torch.float32
        self._noise_measured: float | None | bool = False  # False: not measured yet

    def mixing(self) -> str:
        """Why the step may not be cut for the rows it mixes ("" where it mixes none): runs the
        first micro-batch of the finest cut when nothing ran yet."""
        if not self._losses:
            self._loss(0, min(self.rows, 2))
        if not self.mode.mixing:
            return ""
        ops = ", ".join(f"{op} in {where}" for op, where in list(self.mode.mixing.items())[:3])
        if self.mode.neutralise:
            return (f"{ops} computes statistics over the rows it sees together and has no running statistics the "
                    "check could run it on: pass loss_units= to cut it anyway")
        return (f"{ops} computes statistics over the rows it sees together (batch norm in training mode); "
                "split_batchnorm=True cuts the batch anyway, each micro-batch's statistics its own")

    def verify(self, cuts: list[MicroCut]) -> ExampleBatch:
        """The example with the units every cut in `cuts` (and every cut verified before) keeps the
        step by, and what was verified; else run whole, saying why."""
        try:
            whole = self._loss(0, self.rows)
            mixing = self.mixing()
            if mixing:
                return self.example.whole(mixing)
            if whole is not None and not math.isfinite(whole):
                return self.example.whole(f"the example batch's loss is not finite ({whole})")
            for cut in cuts:
                if all(cut.bounds(self.rows) != known.bounds(self.rows) for known, _ in self._verified):
                    self._verified.append((cut, self._equations(cut, whole)))
        except Unverifiable as error:
            return self.example.whole(str(error))
        return self._judge(whole)

    def _loss(self, start: int, stop: int) -> float | None:
        """The loss of rows start..stop, from the check's state; None where it runs out of memory."""
        if (start, stop) not in self._losses:
            if stop - start >= self._out_of_memory_at:
                return None
            piece = self.batch if (start, stop) == (0, self.rows) else self.layout.take(self.batch, start, stop)
            loss = self._forward(piece, f"rows {start}..{stop} of the example batch")
            if loss is None:
                self._out_of_memory_at = stop - start
                return None
            self._losses[(start, stop)] = loss
        return self._losses[(start, stop)]

    def _forward(self, batch: Any, what: str = "the example batch's rows repeated") -> float | None:
        try:
            with untouched(self.model, self.device), self.mode.watching():
                loss = self.loss_fn(self.model, batch)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    return math.nan
                self._loss_dtype = loss.dtype
                return float(loss.detach().float())
        except LossFnNeeded:
            raise
        except torch.OutOfMemoryError:
            return None
        except (RuntimeError, ValueError, TypeError, IndexError) as error:
            raise Unverifiable(f"the step fails on {what} ({type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''})") from None

    def _equations(self, cut: MicroCut, whole: float | None) -> _Equations:
        bounds = cut.bounds(self.rows)
        losses = [self._loss(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
        if any(loss is None for loss in losses):
            raise Unverifiable(f"a micro-batch of {cut.most} rows does not fit in a forward of its own")
        equations = _Equations(self.layout.pieces(self.batch, bounds), losses)  # type: ignore[arg-type]
        count = len(losses)
        if whole is not None:
            equations.spans.append((0, count, whole))
            return equations
        span = count // 2
        while span >= 2:
            ends = list(range(0, count - span + 1, span))[1:] + [count]
            starts = [0, *ends[:-1]]
            spans = [(a, b, self._loss(bounds[a], bounds[b])) for a, b in zip(starts, ends)]
            if all(loss is not None for _, _, loss in spans):
                equations.spans.extend(spans)  # type: ignore[arg-type]
                return equations
            span //= 2
        raise Unverifiable("the whole batch's forward does not fit on the device, nor does one of two micro-batches "
                           "together, so no cut of it can be checked; pass loss_units= to cut it anyway")

    def _judge(self, whole: float | None) -> ExampleBatch:
        """The units the verified cuts' equations hold by (planner/loss_units.hpp judges them)."""
        tolerance = self._tolerance()
        cuts = [(equations.losses, equations.spans) for _, equations in self._verified]
        counted = [(units.name, [[float(units.count(piece)) for piece in equations.pieces]
                                 for _, equations in self._verified]) for units in self.candidates]
        alike, why_not = judge_loss_units(cuts, counted, tolerance, ", ".join(sorted(self.mode.random)[:3]))
        if not alike:
            return self.example.whole(why_not)
        first, *rest = [self.candidates[index] for index in alike]
        checked = f"{self._checked(whole)}, agreeing within {tolerance:.0e} of the loss"
        return self.example.with_units(LossUnits(first.name, first.count, tuple(rest)), checked)

    def _tolerance(self) -> float:
        dtypes = set(self.mode.dtypes) or {torch.float32}
        if torch.float32 in dtypes and self.device.type == "cuda" and (
                torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32
                or torch.get_float32_matmul_precision() != "highest"):
            dtypes.add(torch.float16)  # tf32 keeps float16's mantissa
        ceiling = max(CEILING.get(dtype, CEILING[torch.float32]) for dtype in dtypes)
        floor = FLOOR.get(self._loss_dtype, FLOOR[torch.float32])
        if self._noise_measured is False:
            self._noise_measured = self._noise()
        noise = self._noise_measured
        return ceiling if noise is None else min(ceiling, max(floor, NOISE_MARGIN * noise))

    def _noise(self) -> float | None:
        """The relative difference between the first micro-batch with a finite loss and the same
        rows repeated to the most rows a forward ran at; None where it cannot be measured."""
        for cut, equations in self._verified:
            bounds = cut.bounds(self.rows)
            for index, loss in enumerate(equations.losses):
                if math.isfinite(loss):
                    break
            else:
                continue
            rows = bounds[index + 1] - bounds[index]
            times = max(self._most_rows() // rows, 2)
            while times >= 2:
                repeated = self._forward(_repeated(equations.pieces[index], rows, times))
                if repeated is not None:
                    scale = max(abs(loss), abs(repeated))
                    return abs(repeated - loss) / scale if scale > 0 else 0.0
                times //= 2
            return None
        return None

    def _most_rows(self) -> int:
        return max(stop - start for (start, stop), loss in self._losses.items())

    def _checked(self, whole: float | None) -> str:
        cuts = " and ".join(str(len(e.pieces)) for _, e in self._verified)
        if whole is not None:
            return f"the whole example batch's loss against its micro-batches' (cut into {cuts})"
        return (f"the example batch's micro-batches (cut into {cuts}) in spans of consecutive ones (the whole batch's "
                "forward does not fit on the device: how the spans add up is not checked)")


def _repeated(batch: Any, rows: int, times: int) -> Any:
    """`batch` (of `rows` rows) with every row repeated `times` times, in order."""

    def repeat(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == rows:
            return leaf.repeat(times, *([1] * (leaf.dim() - 1)))
        return leaf

    return torch.utils._pytree.tree_map(repeat, batch)
