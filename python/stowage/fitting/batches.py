"""The example batch as fit works from it, described once (`ExampleBatch`): the loss a step
computes from it, its layout (planner/batch_layout.hpp), how it cuts (planner/micro_cut.hpp) and
what its loss is a mean over (the counts it may be, read off its tensors; stowage.fitting.cut_check
keeps those the example's own losses verify; README's "A global batch as micro-batches").
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from stowage._core import MicroCut, batch_layout, recording_grids, unit_shares

LossFn = Callable[[Any, Any], torch.Tensor]


class LossFnNeeded(TypeError):
    """The default loss cannot train on this model and batch; fit passes it on wherever it arises."""


def default_loss(model: Any, batch: Any) -> torch.Tensor:
    """The loss of ``model`` on ``batch`` as most training code computes it: ``model(**batch)``
    for a dict, ``model(*batch)`` for a tuple or list, ``model(batch)`` for a tensor; the output
    itself when it is one number, else its ``loss`` (Hugging Face models given labels)."""
    if isinstance(batch, Mapping):
        args, kwargs, call = (), dict(batch), "model(**batch)"
    else:
        args, kwargs, call = (tuple(batch), {}, "model(*batch)") if isinstance(batch, (tuple, list)) \
            else ((batch,), {}, "model(batch)")
    try:
        signature: inspect.Signature | None = inspect.signature(getattr(model, "forward", model))
    except (TypeError, ValueError):  # no signature to read (a builtin): the call will tell
        signature = None
    try:  # binding it (nothing runs): an (images, labels) batch for a model taking images is refused here
        if signature is not None:
            signature.bind(*args, **kwargs)
    except TypeError as error:
        raise LossFnNeeded(
            f"stowage.fit: without loss_fn, fit calls {call}, and {type(model).__name__}.forward does not take "
            f"that batch ({error}). Pass loss_fn=lambda model, batch: ... returning the step's loss, e.g. for "
            "(images, labels): loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])") from None
    output = model(*args, **kwargs)
    loss = output if isinstance(output, torch.Tensor) else getattr(output, "loss", None)
    if isinstance(output, Mapping) and loss is None:
        loss = output.get("loss")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape_or_type = f"a tensor of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) \
            else f"a {type(output).__name__}"
        raise LossFnNeeded(f"stowage.fit: without loss_fn, fit calls {call} and takes its output as the loss, but "
                           f"the output is not a loss (one number, or an output with .loss: it is "
                           f"{shape_or_type}); pass loss_fn=lambda model, batch: ... returning the "
                           "step's loss")
    return loss


def tensor_leaves(batch: Any) -> list[tuple[str, torch.Tensor]]:
    """The batch's tensors with their paths as a user writes them (``batch['labels']``,
    ``batch[1]``, ``batch`` for a tensor batch)."""
    leaves, _ = torch.utils._pytree.tree_flatten_with_path(batch)
    return [("batch" + torch.utils._pytree.keystr(path), leaf) for path, leaf in leaves
            if isinstance(leaf, torch.Tensor)]


@dataclass(frozen=True)
class BatchLayout:
    """A batch's shape as fit reads it (planner/batch_layout.hpp): ``rows``, ``seq`` (None without
    one), ``per_row`` (the paths of the tensors cut with the rows). Read once per batch (`of`); its
    methods cut that same batch (a tensor, or a tuple / list / dict of them; other leaves pass)."""

    rows: int
    seq: int | None
    per_row: tuple[str, ...]

    @staticmethod
    def of(batch: Any) -> BatchLayout:
        """The batch's layout; ValueError naming the tensors when their first dimensions disagree."""
        rows, seq, per_row = batch_layout([(path, list(t.shape), not (t.is_floating_point() or t.is_complex()))
                                           for path, t in tensor_leaves(batch)])
        return BatchLayout(rows, seq, tuple(per_row))

    @property
    def sizes(self) -> dict[str, int]:
        """{"batch": rows} and, when the batch has a sequence dimension, {"seq": length}."""
        return {"batch": self.rows, **({"seq": self.seq} if self.seq is not None else {})}

    def take(self, batch: Any, start: int, stop: int) -> Any:
        """Rows start..stop of every tensor of `batch` with its rows first (contiguous); the rest pass."""
        def take(leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == self.rows:
                return leaf[start:stop].contiguous()
            return leaf

        return torch.utils._pytree.tree_map(take, batch)

    def pieces(self, batch: Any, bounds: tuple[int, ...]) -> list[Any]:
        """`batch` cut at `bounds` (each piece's first row, the rows last)."""
        return [self.take(batch, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]

    def at(self, batch: Any, sizes: Mapping[str, int]) -> Any:
        """`batch` cut to ``sizes["batch"]`` rows and sequences of ``sizes["seq"]``: real inputs."""
        def cut_one(leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0:
                return leaf
            if leaf.shape[0] == self.rows and "batch" in sizes:
                leaf = leaf[:sizes["batch"]]
            if leaf.dim() >= 2 and self.seq is not None and leaf.shape[1] == self.seq and "seq" in sizes:
                leaf = leaf[:, :sizes["seq"]]
            return leaf.contiguous()

        return torch.utils._pytree.tree_map(cut_one, batch)


def shown(sizes: Mapping[str, int]) -> str:  # as fit's messages show them: "batch 8 x seq 512"
    return " x ".join(f"{name} {value}" for name, value in sizes.items())


def profiling_grids(layout: BatchLayout) -> list[dict[str, tuple[int, ...]]]:
    """Grids to record a step at when it does not fit whole, nearest the example first (planner/micro_cut.hpp)."""
    grids = [{name: tuple(values) for name, values in grid} for grid in recording_grids(layout.rows, layout.seq or 0)]
    if not grids:
        raise ValueError(f"stowage.fit: the step does not fit at the example's sizes {layout.sizes}, and they are "
                         "too small to record it smaller (a batch of 3 or more rows, or sequences of 24 or "
                         "more); give a larger example batch")
    return grids


@dataclass(frozen=True)
class LossUnits:
    """What a batch's loss is a mean over, and how many a batch holds. ``alike``: counts the example
    could not tell from this one; a batch they weigh differently is refused (`weighted`)."""

    name: str
    count: Callable[[Any], float]
    alike: tuple[LossUnits, ...] = ()


@dataclass(frozen=True)
class ExampleBatch:
    """The example batch, described once and handed to every later step of fit: the batch, its
    layout, what its loss is a mean over (`units`; None: it runs whole), how it cuts (`cut`; None
    while fit is to choose), why it is not cut, what the cut check verified. Frozen: what fit
    learns later makes a new one."""

    batch: Any
    layout: BatchLayout
    cut: MicroCut | None
    units: LossUnits | None = None
    not_cut: str = ""
    checked: str = ""

    @staticmethod
    def of(batch: Any, micro_batches: int | str) -> ExampleBatch:
        """The example with the cut asked for (MicroCut.asked): a count is run as asked, or refused."""
        layout = BatchLayout.of(batch)
        wrong = micro_batches != "auto" and (isinstance(micro_batches, bool) or not isinstance(micro_batches, int)
                                             or micro_batches < 1)
        if not wrong and micro_batches != "auto" and micro_batches >= 1 << 63:  # (past what MicroCut counts)
            raise ValueError(f"stowage.fit: {micro_batches} micro-batches of a batch of {layout.rows} rows: more "
                             "micro-batches than rows")
        cut = MicroCut.asked(layout.rows, None if wrong or micro_batches == "auto" else micro_batches)  # rows first
        if wrong:
            raise ValueError(f"stowage.fit: micro_batches is 'auto' or a count of 1 or more, not {micro_batches!r}")
        return ExampleBatch(batch, layout, cut)

    @property
    def rows(self) -> int:
        return self.layout.rows

    @property
    def runs_whole(self) -> bool:
        return self.cut is not None and self.cut.count == 1

    def with_units(self, units: LossUnits, checked: str) -> ExampleBatch:  # `checked`: how they were found
        return dataclasses.replace(self, units=units, checked=checked, not_cut="")

    def whole(self, why: str = "") -> ExampleBatch:
        return dataclasses.replace(self, cut=MicroCut.of(self.rows, 1), units=None, not_cut=why, checked="")

    def cut_into(self, count: int, most: int) -> ExampleBatch:
        return dataclasses.replace(self, cut=MicroCut(self.rows, count, most))

    def last_piece(self, cut: MicroCut) -> Any:  # the largest micro-batch: the last (near-equal cuts grow)
        bounds = cut.bounds(self.rows)
        return self.layout.take(self.batch, bounds[-2], bounds[-1])


def weighted(batch: Any, cut: MicroCut, units: LossUnits) -> list[tuple[Any, float]]:
    """The micro-batches and each one's share of the global loss (one with no units left out: its own mean is 0/0)."""
    layout = BatchLayout.of(batch)
    pieces = layout.pieces(batch, cut.bounds(layout.rows))
    if len(pieces) == 1:
        return [(batch, 1.0)]
    counted = [(each.name, [float(each.count(piece)) for piece in pieces]) for each in (units, *units.alike)]
    shares, why_not = unit_shares(*counted[0], counted[1:])
    if why_not:
        raise ValueError(why_not)
    return [(piece, share) for piece, share in zip(pieces, shares) if share > 0]


IGNORE_INDEX = -100
LOSS_UNITS_GIVEN = "loss_units as given"  # what was verified, where the caller said the units


ROWS = LossUnits("rows", lambda batch: float(BatchLayout.of(batch).rows))


def _leaf(batch: Any, path: str) -> torch.Tensor:
    for found, leaf in tensor_leaves(batch):
        if found == path:
            return leaf
    raise ValueError(f"stowage.fit: this batch has no {path}, whose entries the loss was verified to be a mean over "
                     "on the example batch")


def _counted(name: str, path: str, measure: Callable[[torch.Tensor], torch.Tensor]) -> LossUnits:
    return LossUnits(name, lambda batch: float(measure(_leaf(batch, path)).sum()))


def _integer(path: str, leaf: torch.Tensor) -> list[LossUnits]:
    found = [_counted(f"entries of {path} not {IGNORE_INDEX}", path, lambda t: t != IGNORE_INDEX)]
    if leaf.dim() >= 2:
        found.append(_counted(f"entries of {path}[:, 1:] not {IGNORE_INDEX}", path,
                              lambda t: t[:, 1:] != IGNORE_INDEX))
    if bool(((leaf == 0) | (leaf == 1)).all()):
        found.append(_counted(f"nonzero entries of {path}", path, lambda t: t != 0))
        if leaf.dim() >= 2:
            found.append(_counted(f"nonzero entries of {path}[:, 1:]", path, lambda t: t[:, 1:] != 0))
    return found


def candidates(batch: Any, layout: BatchLayout) -> list[LossUnits]:
    """The counts a loss on `batch` (of `layout`) may be a mean over (rows first), from its tensors."""
    found = [ROWS]
    for path, leaf in tensor_leaves(batch):
        if path not in layout.per_row or leaf.dim() == 0:
            continue
        if leaf.dtype == torch.bool:
            found.append(_counted(f"true entries of {path}", path, lambda t: t))
        elif not (leaf.is_floating_point() or leaf.is_complex()):
            found.extend(_integer(path, leaf))
        elif leaf.dim() == 1 and bool(torch.isfinite(leaf).all()) and bool((leaf >= 0).all()):
            found.append(_counted(f"the sum of {path}", path, lambda t: t.double()))
    return found


def given_units(loss_units: str | Callable[[Any], float]) -> LossUnits:
    """The caller's own word for the loss's units, taken without a check: "rows", "tokens" (the
    entries of ``batch['labels']`` not -100), "shifted tokens" (of ``batch['labels'][:, 1:]``) or
    a function counting a batch's."""
    if callable(loss_units):
        return LossUnits("units", lambda batch: float(loss_units(batch)))  # type: ignore[operator]
    named = {"rows": ROWS,
             "tokens": _counted("tokens", "batch['labels']", lambda t: t != IGNORE_INDEX),
             "shifted tokens": _counted("shifted tokens", "batch['labels']", lambda t: t[:, 1:] != IGNORE_INDEX)}
    if loss_units not in named:
        raise ValueError(f"stowage.fit: loss_units is one of {sorted(named)} or a function counting a batch's "
                         f"units, not {loss_units!r}")
    return named[loss_units]
