"""A global batch run as micro-batches: how `fit` cuts it, how each micro-batch's loss is
weighted so the accumulated gradients are those of the global batch's loss, and when a model's
step cannot be cut at all.

Meaning (Note [Micro-batches]): a step of ``k`` micro-batches runs, in order, forward and backward
of each, its loss multiplied by its share of the global batch's *loss units*, gradients
accumulating; then the optimizer's step. That is what torch computes for the same accumulation
written by hand (``(loss_fn(model, micro) * share).backward()`` per micro-batch), bit for bit;
it is the global batch's step up to the rounding of a sum taken in pieces, when the loss is a
mean over its units:

- rows: a loss averaged over the batch's rows (images, sequences of one length), the default;
- tokens: a Hugging Face batch whose ``labels`` are per token, the loss averaged over the labels
  that are not -100 (``ignore_index``), where a causal LM shifts them (``labels[..., 1:]``).

Which of these the loss is, fit reads from the loss itself before it splits anything (`mean_over`):
on a few rows of the example, in eval mode and without gradients, the whole loss against the
parts' losses weighted by each candidate's shares, on a copy whose labels are masked so the
candidates' shares differ. A loss that is a mean over none of them (a sum, a custom weighting)
is not split: fit keeps the batch whole and says why. Where the probe cannot tell the candidates
apart (an untrained model costs every token about the same), a Hugging Face model's own
convention decides: a model that generates from its own past (not an encoder-decoder) averages
over its shifted labels, any other over every label not ignored. Layers whose result depends on the rows
they see together (BatchNorm in training mode) make fit keep the batch whole unless the caller
allows it (``split_batchnorm=True``): their statistics then come from each micro-batch.

Micro-batches are near-equal cuts of the rows (``torch.tensor_split``: sizes differ by at most
one), at least MIN_ROWS each (a single row broadcasts where more do not, so its ops differ from
the lifetime trace's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from stowage.fitting.batches import LossFn, batch_sizes

MIN_ROWS = 2
IGNORE_INDEX = -100


@dataclass(frozen=True)
class LossUnits:
    """What a batch's loss is a mean over, and how many of them a batch holds."""

    name: str  # "rows", "tokens", "shifted tokens" or "units" (the caller's count)
    count: Callable[[Any], int]


def _rows(batch: Any) -> int:
    return batch_sizes(batch)["batch"]


def _labels(batch: Any) -> torch.Tensor | None:
    """A Hugging Face batch's per-token labels, when it has them."""
    labels = batch.get("labels") if isinstance(batch, Mapping) else None
    if isinstance(labels, torch.Tensor) and labels.dim() >= 2 and not labels.is_floating_point():
        return labels
    return None


def _tokens(batch: Any) -> int:
    labels = _labels(batch)
    assert labels is not None
    return int((labels != IGNORE_INDEX).sum())


def _shifted_tokens(batch: Any) -> int:
    labels = _labels(batch)
    assert labels is not None
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


ROWS = LossUnits("rows", _rows)
TOKENS = LossUnits("tokens", _tokens)
SHIFTED_TOKENS = LossUnits("shifted tokens", _shifted_tokens)


def candidates(batch: Any) -> list[LossUnits]:
    return [ROWS, TOKENS, SHIFTED_TOKENS] if _labels(batch) is not None else [ROWS]


def given_units(loss_units: str | Callable[[Any], int]) -> LossUnits:
    """The caller's own word for the loss's units: "rows", "tokens", "shifted tokens" or a
    function counting a batch's."""
    if callable(loss_units):
        return LossUnits("units", lambda batch: int(loss_units(batch)))  # type: ignore[operator]
    named = {units.name: units for units in (ROWS, TOKENS, SHIFTED_TOKENS)}
    if loss_units not in named:
        raise ValueError(f"stowage.fit: loss_units is one of {sorted(named)} or a function counting a batch's "
                         f"units, not {loss_units!r}")
    return named[loss_units]


def rows(batch: Any, start: int, stop: int) -> Any:
    """Rows start..stop of every tensor whose first dimension is the batch's rows (contiguous)."""
    total = _rows(batch)

    def take(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == total:
            return leaf[start:stop].contiguous()
        return leaf

    return torch.utils._pytree.tree_map(take, batch)


def split(batch: Any, micro_rows: int) -> list[Any]:
    """`batch` cut into the fewest near-equal micro-batches of at most `micro_rows` rows."""
    total = _rows(batch)
    count = max(math.ceil(total / micro_rows), 1)
    bounds = [total * i // count for i in range(count + 1)]
    return [rows(batch, bounds[i], bounds[i + 1]) for i in range(count)]


def weighted(batch: Any, micro_rows: int, units: LossUnits) -> list[tuple[Any, float]]:
    """The micro-batches and each one's share of the global loss; a micro-batch with no units
    (every label ignored) is left out: it adds nothing to the global mean, where its own mean
    would be 0/0."""
    pieces = split(batch, micro_rows)
    if len(pieces) == 1:
        return [(batch, 1.0)]
    counts = [units.count(piece) for piece in pieces]
    total = sum(counts)
    if total <= 0:
        raise ValueError(f"stowage.fit: the batch holds no {units.name} to average the loss over")
    return [(piece, count / total) for piece, count in zip(pieces, counts) if count > 0]


def batch_dependent(model: Any) -> list[str]:
    """Modules whose output depends on the rows they see together (BatchNorm in training mode)."""
    return [name or type(module).__name__ for name, module in model.named_modules()
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training]


def _masked(batch: Any) -> Any:
    """A copy of `batch` whose first row keeps only its first and last labels: the candidates'
    shares then differ (rows against tokens; a shifted count skips the first label)."""
    labels = _labels(batch)
    if labels is None:
        return batch
    masked = labels.clone()
    masked[0, 1:-1] = IGNORE_INDEX
    return {**batch, "labels": masked}


def mean_over(model: Any, loss_fn: LossFn, batch: Any) -> tuple[LossUnits | None, str]:
    """Which candidate the loss is a mean over, read from the loss on the example's first rows
    (the caller restores the model's mode, buffers and RNG: stowage.fitting.side_effects), and
    why not, when none: (units, "") or (None, reason)."""
    probe = _masked(rows(batch, 0, min(_rows(batch), 2 * MIN_ROWS)))
    parts = [rows(probe, 0, 1), rows(probe, 1, _rows(probe))]  # (no gradients: one row is only compared)
    was_training = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            whole = float(loss_fn(model, probe))
            losses = [float(loss_fn(model, part)) for part in parts]
    finally:
        for module, training in was_training:
            module.training = training
    if not all(map(math.isfinite, [whole, *losses])):
        return None, "the loss on the example's first rows is not finite"
    tolerance = 1e-3 if _low_precision(model) else 1e-5
    matching = []
    for units in candidates(probe):
        counts = [units.count(part) for part in parts]
        if sum(counts) <= 0:
            continue
        predicted = sum(c * loss for c, loss in zip(counts, losses)) / sum(counts)
        if abs(predicted - whole) <= tolerance * max(abs(whole), 1.0):
            matching.append(units)
    if len(matching) == 1:
        return matching[0], ""
    names = " or ".join(units.name for units in candidates(probe))
    if not matching:
        return None, f"the loss is not a mean over {names} (a sum, or weighted otherwise)"
    convention = _labels_convention(model)
    if convention in matching:  # the model's own loss, whose tokens all predict alike (untrained)
        return convention, ""
    return None, f"the loss reads as a mean over {' and over '.join(u.name for u in matching)} alike"


def _labels_convention(model: Any) -> LossUnits | None:
    """The units a Hugging Face model's own loss averages over, for a probe that cannot tell them
    apart (an untrained model's tokens all cost about the same): a model that generates text
    from its own past (not an encoder-decoder) shifts its labels; others average every label."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "can_generate"):
        return None
    causal = bool(model.can_generate()) and not getattr(config, "is_encoder_decoder", False)
    return SHIFTED_TOKENS if causal else TOKENS


def _low_precision(model: Any) -> bool:
    return any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters())


def asked_micro_rows(rows_in_batch: int, micro_batches: int | str) -> int | None:
    """The rows of a micro-batch as asked: None where fit is to choose ("auto" on a batch it can
    cut into micro-batches of at least MIN_ROWS rows), else a count's cut (1: the whole batch)."""
    if micro_batches == "auto":
        return None if rows_in_batch >= 2 * MIN_ROWS else rows_in_batch
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"stowage.fit: micro_batches is 'auto' or a count of 1 or more, not {micro_batches!r}")
    if micro_batches > 1 and rows_in_batch // micro_batches < MIN_ROWS:
        raise ValueError(f"stowage.fit: {micro_batches} micro-batches of a batch of {rows_in_batch} rows leave "
                         f"fewer than {MIN_ROWS} rows in one")
    return math.ceil(rows_in_batch / micro_batches)
