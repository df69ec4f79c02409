"""What `fit` needs to know about a batch: the loss a step computes from it, the one description of
its shape fit works from (`BatchLayout`: its rows, its sequence length, which of its tensors are
cut with the rows), and the same batch cut to smaller sizes (fewer rows, shorter sequences) to
profile a step that does not fit whole.

A batch is a tensor, or a tuple / list / dict of them (other leaves pass through unchanged). Its
rows are the first dimension of its tensors, which must agree: every tensor of one or more
dimensions has the batch's rows first, or 1 there when it is shared by every row (it broadcasts
over them, as ``position_ids`` of shape [1, S] or a mask of [1, 1, S, S] do; such a tensor is
never cut). A batch whose tensors all have 1 there is a batch of one row; tensors that disagree
otherwise are refused, naming them. Its sequence length, when it has one, is the second dimension
of its first integer tensor of two or more dimensions (token ids). A floating point input's
second dimension is features or channels, which a model cannot take fewer of, so a batch of
images or feature rows has no sequence length. Cutting a batch cuts every tensor that has the
rows first, and the second dimension of those whose second is the sequence length: input ids,
attention masks and labels alike.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

LossFn = Callable[[Any, Any], torch.Tensor]


class LossFnNeeded(TypeError):
    """The default loss cannot train on this model and batch: the model does not take the batch
    as it comes, or its output is not a loss. fit passes it on as it is, wherever it arises (not
    as a failure of a batch it cut)."""


def _call_arguments(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    if isinstance(batch, Mapping):
        return (), dict(batch), "model(**batch)"
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}, "model(*batch)"
    return (batch,), {}, "model(batch)"


def _check_callable_on(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], call: str) -> None:
    """Raises LossFnNeeded when the model's forward does not take these arguments (binding its
    signature: nothing runs), e.g. an (images, labels) batch for a model that takes images."""
    forward = getattr(model, "forward", model)
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        raise LossFnNeeded(
            f"stowage.fit: without loss_fn, fit calls {call}, and {type(model).__name__}.forward does not take "
            f"that batch ({error}). Pass loss_fn=lambda model, batch: ... returning the step's loss, e.g. for "
            "(images, labels): loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])") from None


def default_loss(model: Any, batch: Any) -> torch.Tensor:
    """The loss of ``model`` on ``batch`` as most training code computes it: ``model(**batch)``
    for a dict, ``model(*batch)`` for a tuple or list, ``model(batch)`` for a tensor; the output
    itself when it is one number, else its ``loss`` (Hugging Face models given labels)."""
    args, kwargs, call = _call_arguments(batch)
    _check_callable_on(model, args, kwargs, call)
    output = model(*args, **kwargs)
    loss = output if isinstance(output, torch.Tensor) else getattr(output, "loss", None)
    if isinstance(output, Mapping) and loss is None:
        loss = output.get("loss")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise LossFnNeeded(f"stowage.fit: without loss_fn, fit calls {call} and takes its output as the loss, but "
                           f"the output is not a loss (one number, or an output with .loss: it is "
                           f"{_describe_output(output)}); pass loss_fn=lambda model, batch: ... returning the "
                           "step's loss")
    return loss


def _describe_output(output: Any) -> str:
    if isinstance(output, torch.Tensor):
        return f"a tensor of shape {tuple(output.shape)}"
    return f"a {type(output).__name__}"


def tensor_leaves(batch: Any) -> list[tuple[str, torch.Tensor]]:
    """The batch's tensors with their paths as a user writes them (``batch['labels']``,
    ``batch[1]``, ``batch`` for a tensor batch)."""
    leaves, _ = torch.utils._pytree.tree_flatten_with_path(batch)
    return [("batch" + torch.utils._pytree.keystr(path), leaf) for path, leaf in leaves
            if isinstance(leaf, torch.Tensor)]


@dataclass(frozen=True)
class BatchLayout:
    """A batch's shape as fit reads it (the module's contract): its rows, its sequence length
    (None without one), and the paths of the tensors that have the rows first (the ones cut with
    the rows; the others are shared by every row: 0-d, or 1 first where the batch has more rows).
    Read once per batch (`of`); its methods cut that same batch."""

    rows: int
    seq: int | None
    per_row: tuple[str, ...]

    @staticmethod
    def of(batch: Any) -> BatchLayout:
        """The batch's layout; ValueError naming the tensors when their first dimensions disagree."""
        leaves = [(path, t) for path, t in tensor_leaves(batch) if t.dim() > 0]
        if not leaves:
            raise ValueError("stowage.fit: the example batch holds no tensor with a batch dimension")
        firsts = {int(t.shape[0]) for _, t in leaves} - {1}
        if len(firsts) > 1:
            said = ", ".join(f"{path} has {t.shape[0]}" for path, t in leaves[:6])
            raise ValueError(
                f"stowage.fit: the batch's tensors disagree on its rows (their first dimension): {said}. Every "
                "tensor has the batch's rows first, or 1 when every row shares it (position_ids of [1, S]); pass "
                "what is not per row (a class-weight table, a lookup) through loss_fn instead of the batch")
        rows = firsts.pop() if firsts else 1
        sequences = [t for _, t in leaves if t.dim() >= 2 and not (t.is_floating_point() or t.is_complex())]
        seq = int(sequences[0].shape[1]) if sequences else None
        return BatchLayout(rows, seq, tuple(path for path, t in leaves if t.shape[0] == rows))

    @property
    def sizes(self) -> dict[str, int]:
        """{"batch": rows} and, when the batch has a sequence dimension, {"seq": length}."""
        return {"batch": self.rows, **({"seq": self.seq} if self.seq is not None else {})}

    def take(self, batch: Any, start: int, stop: int) -> Any:
        """Rows start..stop of every tensor of `batch` that has its rows first (contiguous); the
        tensors every row shares pass unchanged."""
        def take(leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == self.rows:
                return leaf[start:stop].contiguous()
            return leaf

        return torch.utils._pytree.tree_map(take, batch)

    def pieces(self, batch: Any, bounds: tuple[int, ...]) -> list[Any]:
        """`batch` cut at `bounds` (each piece's first row, the rows last)."""
        return [self.take(batch, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]

    def at(self, batch: Any, sizes: Mapping[str, int]) -> Any:
        """`batch` cut to ``sizes["batch"]`` rows and sequences of ``sizes["seq"]`` (each at most the
        batch's own); the batch's rows are reused, so the cut batch holds real inputs."""
        def cut_one(leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0:
                return leaf
            if leaf.shape[0] == self.rows and "batch" in sizes:
                leaf = leaf[:sizes["batch"]]
            if leaf.dim() >= 2 and self.seq is not None and leaf.shape[1] == self.seq and "seq" in sizes:
                leaf = leaf[:, :sizes["seq"]]
            return leaf.contiguous()

        return torch.utils._pytree.tree_map(cut_one, batch)


def shown(sizes: Mapping[str, int]) -> str:
    """Sizes as fit's messages show them: ``batch 8 x seq 512``."""
    return " x ".join(f"{name} {value}" for name, value in sizes.items())


SEQUENCE_GRIDS = ((4, 5, 6), (2, 3, 4), (1, 2, 3))  # eighths of the example's sequence, nearest it first


def profiling_grids(layout: BatchLayout) -> list[dict[str, tuple[int, ...]]]:
    """Grids to record a step at when it does not fit whole, nearest the example first (the less
    a size is extrapolated, the less it can miss): two small batch sizes (from 2: one row
    broadcasts where more do not, so its ops differ), and three sequence lengths (attention is
    quadratic in it) from a half, a quarter, then an eighth of the example's up. A size the
    example cannot vary is left out (its value is the example's at every point)."""
    rows: dict[str, tuple[int, ...]] = {"batch": (2, 3)} if layout.rows >= 3 else {}
    seq = layout.seq or 0
    grids = []
    if seq >= 24:
        for eighths in SEQUENCE_GRIDS:
            points = tuple(dict.fromkeys(max(seq * e // 8, 1) for e in eighths))
            if len(points) == 3:
                grids.append({**rows, "seq": points})
    elif rows:
        grids.append(rows)
    if not grids:
        raise ValueError(f"stowage.fit: the step does not fit at the example's sizes {layout.sizes}, and they are "
                         "too small to record it smaller (a batch of 3 or more rows, or sequences of 24 or "
                         "more); give a larger example batch")
    return grids
