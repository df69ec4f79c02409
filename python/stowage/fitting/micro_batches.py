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
CHECK_GROUPS of them) and the one it takes. Counts the example cannot tell apart (its cuts weigh
alike by both) are all kept, and a later batch on which they weigh differently is refused; counts
it cannot tell apart but that weigh its cuts differently (their losses too alike) keep the batch
whole. So does a step that mixes rows (batch norm's statistics, in training mode: its aten ops,
whatever module or function calls them) unless the caller allows it (``split_batchnorm=True``:
each micro-batch's statistics are its own). ``loss_units=`` says the units instead, unchecked.

Cutting: a batch of the example's rows runs as the ``count`` micro-batches fit chose or was asked
for, near-equal cuts of its rows (sizes differ by at most one; ``count`` need not divide the
rows); a larger batch as more, so that none has more rows than the plan's micro-batch; a smaller
one as up to ``count``, none under MIN_ROWS rows (a single row broadcasts where more do not, so
its ops differ from the lifetime trace's). A micro-batch holding no units (every label ignored)
is left out: it adds nothing to the global mean, where its own mean would be 0/0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stowage.fitting.batches import describe, take_rows
from stowage.fitting.loss_units import LossUnits

MIN_ROWS = 2
CHECK_GROUPS = 32  # the finest cut checked, in row groups (a batch of more rows checks larger groups)


@dataclass(frozen=True)
class MicroCut:
    """How fit cuts batches: the example's ``rows`` as ``count`` micro-batches, none of any batch
    over ``most`` rows (the rows the plan is for; at least ceil(rows / count))."""

    rows: int
    count: int
    most: int

    @staticmethod
    def of(rows: int, count: int) -> MicroCut:
        return MicroCut(rows, count, math.ceil(rows / count))

    def pieces(self, rows: int) -> int:
        """How many micro-batches a batch of `rows` runs as."""
        return max(math.ceil(rows / self.most), min(self.count, max(rows // MIN_ROWS, 1)), 1)

    def bounds(self, rows: int) -> tuple[int, ...]:
        """The micro-batches' first rows, and `rows` last: near-equal cuts."""
        count = self.pieces(rows)
        return tuple(rows * i // count for i in range(count + 1))


def groups(rows: int) -> MicroCut:
    """The finest cut fit checks: row groups of at least MIN_ROWS rows, at most CHECK_GROUPS."""
    return MicroCut.of(rows, max(min(rows // MIN_ROWS, CHECK_GROUPS), 1))


def cut_at(batch: Any, bounds: tuple[int, ...]) -> list[Any]:
    return [take_rows(batch, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def split(batch: Any, micro_rows: int) -> list[Any]:
    """`batch` cut into the fewest near-equal micro-batches of at most `micro_rows` rows."""
    total = describe(batch).rows
    count = max(math.ceil(total / micro_rows), 1)
    return cut_at(batch, tuple(total * i // count for i in range(count + 1)))


def weighted(batch: Any, cut: MicroCut, units: LossUnits) -> list[tuple[Any, float]]:
    """The micro-batches and each one's share of the global loss; a micro-batch with no units is
    left out (Note [Micro-batches])."""
    pieces = cut_at(batch, cut.bounds(describe(batch).rows))
    if len(pieces) == 1:
        return [(batch, 1.0)]
    shares = units.shares(pieces)
    return [(piece, share) for piece, share in zip(pieces, shares) if share > 0]


def asked_cut(rows_in_batch: int, micro_batches: int | str) -> MicroCut | None:
    """The cut as asked: None where fit is to choose ("auto" on a batch it can cut into
    micro-batches of at least MIN_ROWS rows), else a count's (1: the whole batch). A count is
    run as asked, or refused: never another."""
    if micro_batches == "auto":
        return None if rows_in_batch >= 2 * MIN_ROWS else MicroCut.of(rows_in_batch, 1)
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"stowage.fit: micro_batches is 'auto' or a count of 1 or more, not {micro_batches!r}")
    if micro_batches > 1 and rows_in_batch // micro_batches < MIN_ROWS:
        raise ValueError(f"stowage.fit: {micro_batches} micro-batches of a batch of {rows_in_batch} rows leave "
                         f"fewer than {MIN_ROWS} rows in one")
    return MicroCut.of(rows_in_batch, micro_batches)
