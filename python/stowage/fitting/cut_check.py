"""Whether cutting the example batch keeps its step (Note [Micro-batches] in planner/micro_cut.hpp;
README's "A global batch as micro-batches"): the forwards run here, without a graph, in the model's
own mode under `CutCheckDispatch`, each from the same state (side_effects.untouched); planner/
loss_units.hpp judges their losses. Where the whole batch's forward runs out of memory, the
micro-batches are checked in spans (as many consecutive ones as a forward holds, at least two).

Contract: one CutCheck per example batch; each loss computed once; not thread-safe.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from stowage import step_context
from stowage._core import MicroCut, judge_loss_units
from stowage.fitting.batches import ExampleBatch, LossFn, LossFnNeeded, LossUnits, candidates
from stowage.fitting.side_effects import untouched

aten = torch.ops.aten
NEVER_MIXING = {aten._native_batch_norm_legit_no_training, aten._batch_norm_no_update}
ALWAYS_TRAINING = {aten._batch_norm_with_update, aten._batch_norm_with_update_functional, aten.batch_norm_stats,
                   aten.batch_norm_gather_stats, aten.batch_norm_gather_stats_with_counts}
DROPOUT_ARGUMENTS = ("dropout_p", "dropout")


def _index(func: Any, name: str) -> int | None:
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return index
    return None


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, default: Any = None) -> Any:
    index = _index(func, name)
    if index is None:
        return default
    if name in kwargs:
        return kwargs[name]
    return args[index] if index < len(args) else default


def _replaced(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str,
              value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    index = _index(func, name)
    if index is None:
        return args, kwargs
    if index < len(args):
        return args[:index] + (value,) + args[index + 1:], kwargs
    return args, {**kwargs, name: value}


class CutCheckDispatch(TorchDispatchMode):
    """The check's forwards at the level of torch's ops: dropout keeps every element (so the whole
    batch and its micro-batches compute one deterministic function of their rows). Found:
    ``mixing``, the row-mixing ops seen (batch norm training on more than one row, SyncBatchNorm's
    statistics) by the module they ran in (with `neutralise_batch_norm`, batch norm runs on its
    running statistics where it has them instead); ``random``, draws that stayed random (a cut
    draws them differently); ``dtypes``, the floating point dtypes made. Entered only by the check."""

    def __init__(self, model: Any, neutralise_batch_norm: bool) -> None:
        super().__init__()
        self.neutralise = neutralise_batch_norm
        self.names = {id(module): name for name, module in model.named_modules()}
        self.mixing: dict[str, str] = {}
        self.random: set[str] = set()
        self.dtypes: set[torch.dtype] = set()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:  # the module each op runs in followed, for a refusal's reason
        unsubscribe = step_context.module_calls.subscribe(compiled=True)
        try:
            with torch.no_grad(), self:
                yield
        finally:
            unsubscribe()

    def _where(self) -> str:
        for module in reversed([call.module for call in step_context.module_calls.stack]):
            if id(module) in self.names:
                name = self.names[id(module)]
                return f"module '{name}'" if name else "the model's own forward"
        return "the loss function"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        packet = func.overloadpacket
        if "batch_norm" in packet.__name__ and packet not in NEVER_MIXING:
            args, kwargs = self._batch_norm(func, args, kwargs)
        elif packet in (aten.native_dropout, aten._fused_dropout) and \
                _argument(func, args, kwargs, "train", True) is not False:
            kept = args[0].clone()
            return kept, torch.ones_like(kept, dtype=torch.bool if packet is aten.native_dropout else torch.uint8)
        elif packet in (aten.bernoulli, aten.bernoulli_):
            result = func(*args, **kwargs)
            return result.fill_(1)
        for name in DROPOUT_ARGUMENTS:
            if isinstance(_argument(func, args, kwargs, name), float):
                args, kwargs = _replaced(func, args, kwargs, name, 0.0)
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random.add(str(packet))
        result = func(*args, **kwargs)
        for leaf in torch.utils._pytree.tree_leaves(result):
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                self.dtypes.add(leaf.dtype)
        return result

    def _batch_norm(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict]:
        always = func.overloadpacket in ALWAYS_TRAINING
        training = always or bool(_argument(func, args, kwargs, "training", False))
        first = args[0] if args else None
        if not training or not isinstance(first, torch.Tensor) or first.dim() == 0 or first.shape[0] <= 1:
            return args, kwargs
        statistics = [_argument(func, args, kwargs, name) for name in ("running_mean", "running_var")]
        if self.neutralise and not always and all(isinstance(s, torch.Tensor) for s in statistics):
            return _replaced(func, args, kwargs, "training", False)
        self.mixing.setdefault(str(func.overloadpacket), self._where())
        return args, kwargs


class Unverifiable(Exception):
    """The check could not run (a forward of two micro-batches does not fit, a forward raised)."""


@dataclass
class _Equations:  # one cut's: its pieces' losses, and each span's (consecutive pieces)

    pieces: list[Any]
    losses: list[float]
    spans: list[tuple[int, int, float]] = field(default_factory=list)  # first piece, end piece, the span's loss


class CutCheck:
    """The check on one example batch: `verify` cuts, or `mixing` alone where the caller gives the
    units. Every forward leaves the model as it found it."""

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
        """Why the step may not be cut for the rows it mixes ("" where it mixes none)."""
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
        """The example with the units every cut verified keeps the step by; else run whole, saying why."""
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

    def _loss(self, start: int, stop: int) -> float | None:  # rows start..stop's; None: out of memory
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

    def _judge(self, whole: float | None) -> ExampleBatch:  # the units every verified cut's equations hold by
        cuts = [(equations.losses, equations.spans) for _, equations in self._verified]
        counted = [(units.name, [[float(units.count(piece)) for piece in equations.pieces]
                                 for _, equations in self._verified]) for units in self.candidates]
        # the dtypes the forwards made and the loss's, read before the noise's own forward adds to them
        dtypes = [str(dtype).removeprefix("torch.") for dtype in (*self.mode.dtypes, self._loss_dtype)]
        tf32 = self.device.type == "cuda" and (torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32
                                               or torch.get_float32_matmul_precision() != "highest")
        if self._noise_measured is False:
            self._noise_measured = self._noise()
        alike, why_not, tolerance = judge_loss_units(cuts, counted, dtypes[:-1], dtypes[-1], tf32, self._noise_measured,
                                                     ", ".join(sorted(self.mode.random)[:3]))
        if not alike:
            return self.example.whole(why_not)
        first, *rest = [self.candidates[index] for index in alike]
        cuts = " and ".join(str(len(e.pieces)) for _, e in self._verified)
        checked = (f"the whole example batch's loss against its micro-batches' (cut into {cuts})" if whole is not None
                   else f"the example batch's micro-batches (cut into {cuts}) in spans of consecutive ones (the whole "
                   "batch's forward does not fit on the device: how the spans add up is not checked)")
        return self.example.with_units(LossUnits(first.name, first.count, tuple(rest)),
                                       f"{checked}, agreeing within {tolerance:.0e} of the loss")

    def _noise(self) -> float | None:
        """The relative difference between the first finite micro-batch's loss and its rows repeated
        (to the most rows a forward ran at); None where it cannot be measured."""
        for cut, equations in self._verified:
            bounds = cut.bounds(self.rows)
            for index, loss in enumerate(equations.losses):
                if math.isfinite(loss):
                    break
            else:
                continue
            rows = bounds[index + 1] - bounds[index]
            times = max(max(stop - start for start, stop in self._losses) // rows, 2)
            while times >= 2:
                repeated = self._forward(_repeated(equations.pieces[index], rows, times))
                if repeated is not None:
                    scale = max(abs(loss), abs(repeated))
                    return abs(repeated - loss) / scale if scale > 0 else 0.0
                times //= 2
            return None
        return None


def _repeated(batch: Any, rows: int, times: int) -> Any:
    """`batch` (of `rows` rows) with every row repeated `times` times, in order."""
    def repeat(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == rows:
            return leaf.repeat(times, *([1] * (leaf.dim() - 1)))
        return leaf

    return torch.utils._pytree.tree_map(repeat, batch)
