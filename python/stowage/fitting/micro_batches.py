"""A global batch run as micro-batches: how `fit` cuts it and how each micro-batch's loss is
weighted so the accumulated gradients are those of the global batch's loss.

Note [Micro-batches]
Meaning: a step of ``k`` micro-batches runs, in order, forward and backward of each, its loss
multiplied by its share of the global batch's *loss units*, gradients accumulating; then the
optimizer's step. That is what torch computes for the same accumulation written by hand
(``(loss_fn(model, micro) * share).backward()`` per micro-batch), bit for bit; it is the global
batch's step up to the rounding of a sum taken in pieces exactly when the global batch's loss is
the micro-batches' losses weighted by those shares.

fit never takes that on trust (stowage.fitting.cut_check). Before it cuts, it runs the step's
forward without a graph on the example batch itself and on its micro-batches, and keeps a cut
only where the whole batch's loss equals the micro-batches' losses weighted by the shares it will
use, within the rounding of the step's least precise dtype, for one of the counts the batch's
tensors offer (stowage.fitting.loss_units: rows, entries not -100, masks, per-row weights). It
checks two cuts of every row: the finest it may take (row groups of MIN_ROWS rows, at most
32 of them) and the one it takes. Counts the example cannot tell apart (its cuts weigh
alike by both) are all kept, and a later batch on which they weigh differently is refused; counts
it cannot tell apart but that weigh its cuts differently (their losses too alike) keep the batch
whole. So does a step that mixes rows (batch norm's statistics, in training mode: its aten ops,
whatever module or function calls them) unless the caller allows it (``split_batchnorm=True``:
each micro-batch's statistics are its own). ``loss_units=`` says the units instead, unchecked.

Cutting: a batch of the example's rows runs as the ``count`` micro-batches fit chose or was asked
for, near-equal cuts of its rows (sizes differ by at most one; ``count`` need not divide the
rows); a larger batch as more, so that none has more rows than the plan's micro-batch; a smaller
one as up to ``count``, none under MIN_ROWS rows (a single row broadcasts where more do not, so
its ops differ from the lifetime trace's): planner/micro_cut.hpp, bound as MicroCut. A
micro-batch holding no units (every label ignored) is left out: it adds nothing to the global
mean, where its own mean would be 0/0.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from stowage._core import MIN_ROWS, MicroCut
from stowage.fitting.batches import BatchLayout
from stowage.fitting.loss_units import LossUnits


@dataclass(frozen=True)
class ExampleBatch:
    """The example batch as fit works from it, described once where fit first sees it and handed
    to every later step (recording, the cut check, the trial, the fitted step, the table): the
    batch, its layout (rows, sequence length), what its loss is a mean over (`units`; None: it
    runs whole), how it cuts (`cut`; None while fit is to choose), why it is not cut, and what the
    cut check verified. Frozen: what fit learns later makes a new one."""

    batch: Any
    layout: BatchLayout
    cut: MicroCut | None
    units: LossUnits | None = None
    not_cut: str = ""
    checked: str = ""

    @staticmethod
    def of(batch: Any, micro_batches: int | str) -> ExampleBatch:
        """The example with the cut asked for: none where fit is to choose ("auto" on a batch it can
        cut into micro-batches of at least MIN_ROWS rows), else a count's (1: the whole batch). A
        count is run as asked, or refused: never another."""
        layout = BatchLayout.of(batch)
        rows = layout.rows
        if rows < 1:
            raise ValueError("stowage.fit: the example batch has no rows (its tensors' first dimension is 0); give "
                             "fit the largest batch the loop trains on")
        if micro_batches == "auto":
            return ExampleBatch(batch, layout, None if rows >= 2 * MIN_ROWS else MicroCut.of(rows, 1))
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"stowage.fit: micro_batches is 'auto' or a count of 1 or more, not {micro_batches!r}")
        if micro_batches > 1 and rows // micro_batches < MIN_ROWS:
            raise ValueError(f"stowage.fit: {micro_batches} micro-batches of a batch of {rows} rows leave "
                             f"fewer than {MIN_ROWS} rows in one")
        return ExampleBatch(batch, layout, MicroCut.of(rows, micro_batches))

    @property
    def rows(self) -> int:
        return self.layout.rows

    @property
    def runs_whole(self) -> bool:
        return self.cut is not None and self.cut.count == 1

    def with_units(self, units: LossUnits, checked: str) -> ExampleBatch:
        """The example cut by `units`, `checked` saying how they were found."""
        return dataclasses.replace(self, units=units, checked=checked, not_cut="")

    def whole(self, why: str = "") -> ExampleBatch:
        """The example run whole, `why` it is not cut."""
        return dataclasses.replace(self, cut=MicroCut.of(self.rows, 1), units=None, not_cut=why, checked="")

    def cut_into(self, count: int, most: int) -> ExampleBatch:
        """The example cut as fit chose: `count` micro-batches of at most `most` rows."""
        return dataclasses.replace(self, cut=MicroCut(self.rows, count, most))

    def last_piece(self, cut: MicroCut) -> Any:
        """The largest of `cut`'s micro-batches of the example (the last: near-equal cuts grow)."""
        bounds = cut.bounds(self.rows)
        return self.layout.take(self.batch, bounds[-2], bounds[-1])


def split(batch: Any, micro_rows: int) -> list[Any]:
    """`batch` cut into the fewest near-equal micro-batches of at most `micro_rows` rows."""
    layout = BatchLayout.of(batch)
    count = max(math.ceil(layout.rows / micro_rows), 1)
    return layout.pieces(batch, tuple(layout.rows * i // count for i in range(count + 1)))


def weighted(batch: Any, cut: MicroCut, units: LossUnits) -> list[tuple[Any, float]]:
    """The micro-batches and each one's share of the global loss; a micro-batch with no units is
    left out (Note [Micro-batches])."""
    layout = BatchLayout.of(batch)
    pieces = layout.pieces(batch, cut.bounds(layout.rows))
    if len(pieces) == 1:
        return [(batch, 1.0)]
    shares = units.shares(pieces)
    return [(piece, share) for piece, share in zip(pieces, shares) if share > 0]
