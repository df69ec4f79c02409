"""The exactness suite on a GPU: tests/python/test_exactness.py's matrix (every main feature x
loop pattern on the GPT, every feature x model on the plain loop, the optimizer variants), run by
the same harness (tests/python/exactness/) with its models, batches, RNG streams and comparisons
on the GPU.

conftest.py made stowage torch's CUDA allocator for this whole process before CUDA started, so
each cell's feature run is held to plain torch in the same process, on that allocator (it does
not touch numerics); the allocator-alone cell, which needs torch's own allocator for its
reference, is n/a here (the allocator's GPU behaviour is tests/gpu/python/test_torch_cuda.py's).
Every run is deterministic: torch's deterministic algorithms, cuBLAS with a fixed workspace
(CUBLAS_WORKSPACE_CONFIG, set below before anything runs cuBLAS, and by tests/gpu/run.sh),
cuDNN's deterministic algorithms (exactness.devices.session). The host optimizer's cells are
held to twice the spread between torch's fused and foreach AdamW measured on this GPU (foreach
is the reference, as it is torch's default there), and at least 2 ulps.

    python3 -m pytest tests/gpu/python/test_exactness_gpu.py -q   # on a GPU machine; skipped without
    python3 tests/python/exactness/matrix.py --device cuda        # the same, as tables
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

# Read when cuBLAS first runs in this process: nothing has yet (conftest.py only installs the
# allocator). Without it torch's deterministic mode refuses every product.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest  # noqa: E402

HARNESS = Path(__file__).resolve().parents[2] / "python"  # tests/python: the exactness package
if str(HARNESS) not in sys.path:
    sys.path.append(str(HARNESS))

from exactness.cells import Caches, Cell, Config  # noqa: E402
from exactness.devices import session  # noqa: E402
from exactness.suite import assert_a_small_optimizer_bug_is_seen, check, parametrize  # noqa: E402

DEVICE = "cuda"


def _config(config: Any) -> Config:
    """The default matrix on the GPU (``--full`` where tests/python's conftest defines it)."""
    return Config(full=bool(config.getoption("--full", default=False)), device=DEVICE)


def pytest_generate_tests(metafunc: Any) -> None:
    parametrize(metafunc, _config(metafunc.config))


@pytest.fixture(scope="module")
def caches(request: Any) -> Iterator[Caches]:
    """The module's caches (profiles, plans, references, tolerances), every cell under the GPU
    session's deterministic settings (put back as they were after the module)."""
    config = _config(request.config)
    with session(config.device):
        yield Caches(config)


def test_exactness_gpu(cell: Cell, caches: Caches) -> None:
    check(cell, caches)


def test_a_weight_decay_ten_percent_off_fails_on_the_gpu_too(caches: Caches) -> None:
    """The tolerance measured on the GPU does not hide a 1e-7-a-step optimizer bug."""
    assert_a_small_optimizer_bug_is_seen(caches)
