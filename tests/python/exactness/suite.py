"""The pytest side of the matrix, shared by the CPU-mode module (tests/python/test_exactness.py)
and the GPU one (tests/gpu/python/test_exactness_gpu.py): which cells a module runs, how a cell's
outcome becomes a test's, and the suite's check of itself that holds on every device.

Contract: a module calls ``parametrize`` from its ``pytest_generate_tests`` with its Config, makes
its Caches inside ``devices.session(config.device)`` (module-scoped), and calls ``check`` per
cell: PASS and REFUSED pass, N/A skips with "n/a: <reason>", FAIL fails with the reason alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from exactness.cells import Caches, Cell, Config, _reference, _tolerance, cells, execute, run_cell
from exactness.compare import difference
from exactness.features import VARIANTS, Env, Setup
from exactness.models import spec
from exactness.patterns import PATTERNS


def parametrize(metafunc: Any, config: Config) -> None:
    """The test's ``cell`` argument over the matrix `config` takes, named by the cells' ids."""
    if "cell" in metafunc.fixturenames:
        chosen = cells(config)
        metafunc.parametrize("cell", chosen, ids=[c.id for c in chosen])


def check(cell: Cell, caches: Caches) -> None:
    """Runs one cell and turns its outcome into the test's."""
    outcome = run_cell(cell, caches)
    if outcome.status == "N/A":
        pytest.skip(f"n/a: {outcome.reason}")
    if outcome.status == "FAIL":
        pytest.fail(outcome.reason, pytrace=False)


class _Nudged(Setup):
    """torch's optimizer with weight decay 0.09 for 0.1: 1e-7 of a parameter a step."""

    def optimizer(self, groups: Any) -> torch.optim.Optimizer:
        return super().optimizer([{**g, "weight_decay": g["weight_decay"] * 0.9} for g in groups])


def assert_a_small_optimizer_bug_is_seen(caches: Caches) -> None:
    """A subtle optimizer bug (weight decay ten percent off) is told apart from torch bitwise and
    within the host optimizer's tolerance measured on this device, so a passing cell is not a
    blind one; and torch's fused and foreach AdamW do differ here (the tolerance is not 0)."""
    model, plain = spec("gpt", caches.config.device), PATTERNS["plain"]
    reference = _reference(caches, model, plain, "adamw", "stowage_allocator")
    tolerance = _tolerance(caches, model, plain, "adamw", "stowage_allocator")
    assert tolerance["state"] > 0.0, "torch's fused and foreach AdamW agree bit for bit: no tolerance was measured"
    ours = execute(model, plain, lambda env, m, g: _Nudged(VARIANTS["adamw"]), Env(model, caches, 1),
                   caches.config.steps)
    assert ours.failure is None
    assert "param" in (difference(ours, reference, None) or "")
    assert "param" in (difference(ours, reference, tolerance) or "")
