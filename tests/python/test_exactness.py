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


# --- the suite's own checks: it sees a small difference, and judges refusals as it says ----------

def test_a_weight_decay_ten_percent_off_fails_bitwise_and_within_the_host_tolerance(caches: Caches) -> None:
    """A subtle optimizer bug (weight decay 0.09 for 0.1: 1e-7 of a parameter a step) is told
    apart from torch in both modes, so a passing cell is not a blind one."""
    from exactness.cells import _reference, _tolerance, execute
    from exactness.compare import difference
    from exactness.features import VARIANTS, Env, Setup
    from exactness.models import spec
    from exactness.patterns import PATTERNS

    class Nudged(Setup):
        def optimizer(self, groups: Any) -> Any:
            return super().optimizer([{**g, "weight_decay": g["weight_decay"] * 0.9} for g in groups])

    model, plain = spec("gpt"), PATTERNS["plain"]
    reference = _reference(caches, model, plain, "adamw", "cpu_mode")
    tolerance = _tolerance(caches, model, plain, "adamw", "cpu_mode")
    assert tolerance["state"] > 0.0  # torch's fused and foreach AdamW do differ
    ours = execute(model, plain, lambda env, m, g: Nudged(VARIANTS["adamw"]), Env(model, caches, 1),
                   caches.config.steps)
    assert ours.failure is None
    assert "param" in (difference(ours, reference, None) or "")
    assert "param" in (difference(ours, reference, tolerance) or "")


def test_a_refusal_passes_only_naming_in_backward_at_the_first_point_with_torch_s_parameters(caches: Caches) -> None:
    from exactness.cells import _reference, judge_refusal
    from exactness.compare import Failure, parameters_at
    from exactness.features import FEATURES
    from exactness.models import spec
    from exactness.patterns import PATTERNS

    feature, pattern = FEATURES["adamw.in_backward"], PATTERNS["clip_torch"]
    reference = _reference(caches, spec("gpt"), pattern, "adamw", "cpu_mode")
    start = parameters_at(reference, 0)
    named = RuntimeError("stowage.offload.AdamW(update='in_backward') already updated ...")
    steps = caches.config.steps

    def judged(error: BaseException, step: int, phase: str, params: dict[str, Any]) -> str:
        return judge_refusal(feature, pattern, Failure(error, step, phase, params), reference, {}, steps).status

    assert judged(named, 0, "step", start) == "REFUSED"
    assert judged(named, 0, "clip", start) == "FAIL"  # not where the pattern shows
    assert judged(RuntimeError("cannot step"), 0, "step", start) == "FAIL"  # does not name in_backward
    moved = {name: value + 1e-3 for name, value in start.items()}
    assert judged(named, 0, "step", moved) == "FAIL"  # the parameters already differ
    assert judge_refusal(FEATURES["adamw.exact"], pattern, Failure(named, 0, "step", start), reference, {},
                         steps).status == "FAIL"  # only update="in_backward" may refuse
