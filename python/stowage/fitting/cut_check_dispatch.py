"""How the forwards of fit's cut check run (stowage.fitting.cut_check): in the model's own mode
(training: the mode whose behaviour a cut changes), with dropout keeping everything, so that the
whole batch and its micro-batches compute one deterministic function of their rows; and what the
forwards showed: ops that mix rows, random draws that stayed random, the least precise dtype.

At the level of torch's ops (a TorchDispatchMode, so whatever module or function calls them):

- dropout keeps every element: ``native_dropout`` and ``_fused_dropout`` return their input,
  ``bernoulli`` draws (dropout's mask, stochastic depth) are all ones, and an op's ``dropout`` or
  ``dropout_p`` argument (scaled_dot_product_attention's kernels, cuDNN's RNNs) is 0. Any other
  random draw (``aten.rand``, ``aten.randn`` ...) stays random; its name is kept for the reason
  a check fails (the whole batch and its micro-batches draw differently).
- batch norm in training mode (any op of torch's batch norm family with ``training`` true, or
  SyncBatchNorm's statistics) on more than one row mixes rows; with `neutralise_batch_norm` it
  runs on its running statistics instead where it has them (the check then asks about the loss,
  the caller having accepted per micro-batch statistics), and is a mixing op where it has none.

Contract: one `CutCheckDispatch` per check, entered around each forward (no gradients); it never
changes what a training step computes (it is only entered by the check).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from stowage import step_context

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
    """Dropout off and batch norm watched (see the module's contract); ``mixing``: the row-mixing
    ops seen, each with the module it ran in; ``random``: random ops that stayed random;
    ``dtypes``: the floating point dtypes the ops made."""

    def __init__(self, model: Any, neutralise_batch_norm: bool) -> None:
        super().__init__()
        self.neutralise = neutralise_batch_norm
        self.names = {id(module): name for name, module in model.named_modules()}
        self.mixing: dict[str, str] = {}
        self.random: set[str] = set()
        self.dtypes: set[torch.dtype] = set()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """The mode, with the module each op runs in followed (for the reason a cut is refused)."""
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
