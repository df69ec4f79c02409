"""The exactness suite: every cell (feature x loop pattern x model) trains with the feature and
with plain torch from the same seed and state, and must compute the same (bitwise, or within
torch's own fused-vs-foreach difference for the host optimizer) or refuse where refusing is
allowed (update="in_backward" with clipping through torch, unmarked accumulation, a gradient
changed after backward), at the first point the pattern shows. ``--full`` runs every model x
pattern x feature at larger sizes; the default runs every main feature x pattern on one model
and every feature x model on the plain loop. See tests/python/exactness/; the same harness runs
on a GPU in tests/gpu/python/test_exactness_gpu.py."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from exactness.cells import Caches, Cell, Config  # noqa: E402
from exactness.devices import session  # noqa: E402
from exactness.suite import assert_a_small_optimizer_bug_is_seen, check, parametrize  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def _config(config: Any) -> Config:
    return Config(full=bool(config.getoption("--full", default=False)))


def pytest_generate_tests(metafunc: Any) -> None:
    parametrize(metafunc, _config(metafunc.config))


@pytest.fixture(scope="module")
def caches(request: Any) -> Any:
    """The session's caches, under CPU mode's session settings (torch on one thread: the cells'
    ops are small, and on a shared 2-core machine a second thread costs more than it gives)."""
    config = _config(request.config)
    with session(config.device):
        yield Caches(config)


def test_exactness(cell: Cell, caches: Caches) -> None:
    check(cell, caches)


# --- the suite's own checks: it sees a small difference, and judges refusals as it says ----------

def test_a_weight_decay_ten_percent_off_fails_bitwise_and_within_the_host_tolerance(caches: Caches) -> None:
    """A subtle optimizer bug (weight decay 0.09 for 0.1: 1e-7 of a parameter a step) is told
    apart from torch in both modes, so a passing cell is not a blind one."""
    assert_a_small_optimizer_bug_is_seen(caches)


def test_a_refusal_passes_only_naming_in_backward_at_the_first_point_with_torch_s_parameters(caches: Caches) -> None:
    from exactness.cells import _reference, judge_refusal
    from exactness.compare import Failure, parameters_at
    from exactness.features import FEATURES
    from exactness.models import spec
    from exactness.patterns import PATTERNS

    feature, pattern = FEATURES["adamw.in_backward"], PATTERNS["clip_torch"]
    reference = _reference(caches, spec("gpt"), pattern, "adamw", "stowage_allocator")
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


def test_a_plan_s_refusal_passes_only_naming_the_recomputation_where_the_pattern_shows(caches: Caches) -> None:
    from exactness.cells import _reference, judge_refusal
    from exactness.compare import Failure, parameters_at
    from exactness.features import FEATURES
    from exactness.models import spec
    from exactness.patterns import PATTERNS

    pattern = PATTERNS["data_saved_block"]
    reference = _reference(caches, spec("gpt"), pattern, "adamw", "stowage_allocator")
    steps = caches.config.steps
    event = steps // 3
    at_event = parameters_at(reference, event)
    named = RuntimeError("stowage.plan: block 'blocks.0' is recomputed in backward, and ... was written after ...")

    def judged(feature: str, error: BaseException, step: int, phase: str) -> str:
        return judge_refusal(FEATURES[feature], pattern, Failure(error, step, phase, at_event), reference, {},
                             steps).status

    for feature in ("plan", "plan.recompute", "fit"):
        assert judged(feature, named, event, "backward 1") == "REFUSED", feature
    assert judged("plan.recompute", named, event, "forward 1") == "FAIL"  # not where the pattern shows
    assert judged("plan.recompute", RuntimeError("cannot recompute"), event, "backward 1") == "FAIL"  # unnamed
    assert judged("activations", named, event, "backward 1") == "FAIL"  # offload must see the write, not refuse
    assert judge_refusal(FEATURES["plan.recompute"], PATTERNS["plain"], Failure(named, event, "backward 1", at_event),
                         reference, {}, steps).status == "FAIL"  # only the patterns that write through .data
