"""What a loss may be a mean over, read off the example batch's tensors: the counts fit weighs
micro-batches by. None of these is taken on trust: stowage.fitting.cut_check keeps only the ones
the example batch's own losses verify (Note [Micro-batches]).

The candidates, in this order (the first of those a check cannot tell apart names them):

- rows: a loss averaged over the batch's rows;
- for each integer tensor with the batch's rows: its entries that are not -100 (``ignore_index``:
  padded labels, padded rows of class labels), and for one of two or more dimensions those of
  ``[:, 1:]`` (a causal LM shifts its labels); where its values are all 0 or 1, its nonzero
  entries (an attention mask), and of ``[:, 1:]``;
- for each bool tensor with the batch's rows: its true entries (a mask of the rows or tokens
  that count);
- for each floating point tensor of one dimension with the batch's rows, none of them negative:
  its sum (per-row weights, ``(w * losses).sum() / w.sum()``).

A count is looked up in a later batch by the same path; a batch without it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from stowage._core import SHARES_ALIKE
from stowage.fitting.batches import BatchLayout, tensor_leaves

IGNORE_INDEX = -100
LOSS_UNITS_GIVEN = "loss_units as given"  # what was verified, where the caller said the units


@dataclass(frozen=True)
class LossUnits:
    """What a batch's loss is a mean over, and how many of them a batch holds. ``alike``: counts
    the example batch could not tell from this one (they weighed every cut of it alike); a batch
    they weigh differently is refused (`shares`)."""

    name: str
    count: Callable[[Any], float]
    alike: tuple[LossUnits, ...] = ()

    def shares(self, pieces: list[Any]) -> list[float]:
        """Each piece's share of the pieces' units; ValueError where a count the example could not
        tell from this one weighs them differently."""
        counts = [float(self.count(piece)) for piece in pieces]
        shares = _normalised(counts, self.name)
        for other in self.alike:
            theirs = _normalised([float(other.count(piece)) for piece in pieces], other.name)
            if any(abs(a - b) > SHARES_ALIKE for a, b in zip(shares, theirs)):
                raise ValueError(
                    f"stowage.fit: this batch's micro-batches weigh {_shown(shares)} by {self.name} and "
                    f"{_shown(theirs)} by {other.name}, and the example batch could not tell which of them the "
                    "loss is a mean over (it weighed its own micro-batches alike by both). Give fit an example "
                    "batch like this one (its padding, its masks), or say which: loss_units=...")
        return shares




def _normalised(counts: list[float], name: str) -> list[float]:
    total = sum(counts)
    if not total > 0:
        raise ValueError(f"stowage.fit: the batch holds no {name} to average the loss over")
    return [count / total for count in counts]


def _shown(shares: list[float]) -> str:
    return "/".join(f"{share:.3f}" for share in shares)


def _rows(batch: Any) -> float:
    return float(BatchLayout.of(batch).rows)


ROWS = LossUnits("rows", _rows)


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
