"""The exactness suite: every cell (feature x loop pattern x model) trains with the feature and
with plain torch from the same seed and state, and must compute the same (bitwise, or within
torch's own fused-vs-foreach difference for the host optimizer) or refuse where refusing is
allowed (update="in_backward" with clipping through torch, unmarked accumulation, a gradient
changed after backward), at the first point the pattern shows. ``--full`` runs every model x
pattern x feature at larger sizes; the default runs every main feature x pattern on one model
and every feature x model on the plain loop. See tests/python/exactness/."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from exactness.cells import Caches, Cell, Config, cells, run_cell  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def _config(config: Any) -> Config:
    return Config(full=bool(config.getoption("--full", default=False)))


def pytest_generate_tests(metafunc: Any) -> None:
    if "cell" in metafunc.fixturenames:
        chosen = cells(_config(metafunc.config))
        metafunc.parametrize("cell", chosen, ids=[c.id for c in chosen])


@pytest.fixture(scope="module")
def caches(request: Any) -> Any:
    """The session's caches, with torch on one thread: the cells' ops are small, and on a shared
    2-core machine a second thread costs more than it gives (both runs of a cell use the same)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Caches(_config(request.config))
    torch.set_num_threads(threads)


def test_exactness(cell: Cell, caches: Caches) -> None:
    outcome = run_cell(cell, caches)
    if outcome.status == "N/A":
        pytest.skip(f"n/a: {outcome.reason}")
    if outcome.status == "FAIL":
        pytest.fail(outcome.reason, pytrace=False)
