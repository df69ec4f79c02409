"""The counts a loss on the example batch may be a mean over, read off its tensors in README's
order ("A global batch as micro-batches": rows; integer entries not -100, of [:, 1:] too; 0/1
entries that are nonzero; bool entries that are true; a one-dimensional non-negative float's sum);
stowage.fitting.cut_check keeps those the example's own losses verify. A count is looked up in a
later batch by the same path; a batch without it is refused.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from stowage.fitting.batches import BatchLayout, LossUnits, tensor_leaves

IGNORE_INDEX = -100
LOSS_UNITS_GIVEN = "loss_units as given"  # what was verified, where the caller said the units


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
