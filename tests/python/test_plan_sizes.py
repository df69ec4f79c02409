"""stowage.plan at several sizes (stowage.plan.sizes): a step recorded at small batches and
sequence lengths predicts the byte counts of a larger one; a model that runs out of memory at the
size it trains at is profiled small, planned large and trains under its plan; grids whose steps
differ, and sizes that cannot be planned, are refused with their reason."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage.plan  # noqa: E402
import stowage.plan.sizes  # noqa: E402
from offload_models import TinyGpt, lm_loss  # noqa: E402
from plan_files_fuzzer import small_profile  # noqa: E402
from stowage.validation import InputError  # noqa: E402
from test_plan import COST  # noqa: E402

HERE = Path(__file__).resolve().parent
GRID = {"batch": (2, 3), "seq": (32, 64, 96)}

pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def gpt_at() -> Callable[..., None]:
    torch.manual_seed(0)
    model = TinyGpt(vocab=512, width=128, heads=4, layers=4, length=256)

    def step(batch: int, seq: int) -> None:
        ids = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(batch * seq))
        model.zero_grad(set_to_none=True)
        lm_loss(model(ids), ids).backward()

    return step


def test_a_step_recorded_small_predicts_the_bytes_of_a_larger_one(tmp_path: Path) -> None:
    step = gpt_at()
    sized = stowage.plan.profile(step, sizes=GRID, cost=COST)
    assert isinstance(sized, stowage.plan.SizedTrace) and len(sized.traces) == 6
    step(6, 160)  # the direct recording below starts from the state the grid's steps did
    direct = stowage.plan.profile(lambda: step(6, 160), cost=COST)
    predicted = sized.at({"batch": 6, "seq": 160})
    assert [t.packs for t in predicted.tensors] == [t.packs for t in direct.tensors]
    assert [t.bytes for t in predicted.tensors] == [t.bytes for t in direct.tensors]
    assert [o.io_bytes for o in predicted.ops] == [o.io_bytes for o in direct.ops]
    assert predicted.unconstrained_peak_bytes == pytest.approx(direct.unconstrained_peak_bytes, rel=0.03)
    assert all(o.duration_ms >= 0 for o in predicted.ops)
    # Planned from the small recording, the plan fits on the large step's own trace.
    budget = direct.unconstrained_peak_bytes // 2
    plan = stowage.plan.solve(sized, budget, at={"batch": 6, "seq": 160})
    on_direct = stowage.plan.Plan(direct, plan.decisions, budget)
    assert on_direct.predicted_peak_bytes <= budget * 1.03
    sized.save(tmp_path / "sized.json")
    loaded = stowage.plan.load_trace(tmp_path / "sized.json")
    assert isinstance(loaded, stowage.plan.SizedTrace) and loaded.sizes == sized.sizes
    assert [t.bytes for t in loaded.at({"batch": 6, "seq": 160}).tensors] == [t.bytes for t in direct.tensors]


def test_bad_sizes_and_grids_whose_steps_differ_are_refused() -> None:
    step = gpt_at()
    with pytest.raises(ValueError, match="two or more distinct"):
        stowage.plan.profile(step, sizes={"batch": (2,)}, cost=COST)
    with pytest.raises(ValueError, match="ops do not depend on its sizes"):  # batch 1 broadcasts
        stowage.plan.profile(step, sizes={"batch": (1, 2), "seq": (32, 64)}, cost=COST)
    sized = stowage.plan.profile(step, sizes={"batch": (2, 3), "seq": (32, 64)}, cost=COST)
    with pytest.raises(ValueError, match="give the sizes to plan for"):
        stowage.plan.solve(sized, "1MiB")
    with pytest.raises(ValueError, match="recorded at sizes"):
        sized.at({"batch": 4})
    single = stowage.plan.profile(lambda: step(2, 32), cost=COST)
    with pytest.raises(ValueError, match="several sizes"):
        stowage.plan.solve(single, "1MiB", at={"batch": 4, "seq": 64})


def test_the_command_plans_a_sized_profile_at_the_sizes_given(tmp_path: Path) -> None:
    step = gpt_at()
    path = tmp_path / "sized.json"
    stowage.plan.profile(step, sizes={"batch": (2, 3), "seq": (32, 64)}, cost=COST).save(path)

    def stowage_plan(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stowage", "plan", str(path), *args], capture_output=True,
                              text=True, timeout=120)

    done = stowage_plan("--budget", "50%", "--at", "batch=8,seq=128")
    assert done.returncode == 0, done.stderr
    assert "full checkpointing" in done.stdout
    missing = stowage_plan("--budget", "50%")
    assert missing.returncode == 2 and "--at batch=3,seq=64" in missing.stderr
    bad = stowage_plan("--budget", "50%", "--at", "batch=lots")
    assert bad.returncode == 2 and "name=number" in bad.stderr


OUT_OF_MEMORY = """
    import torch, stowage, stowage.plan
    from offload_models import TinyGpt, lm_loss

    stowage.enable(device="cpu", capacity="72MiB")
    COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}
    torch.manual_seed(0)
    model = TinyGpt(vocab=512, width=128, heads=4, layers=4, length=256)

    def step(batch, seq):
        ids = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(batch * seq))
        model.zero_grad(set_to_none=True)
        loss = lm_loss(model(ids), ids)
        loss.backward()
        return loss

    try:
        step(8, 256)
        print("plain: fits")
    except torch.OutOfMemoryError:
        print("plain: out of memory")
    try:
        stowage.plan.profile(lambda: step(8, 256), cost=COST)
    except torch.OutOfMemoryError as error:
        print("profile:", "sizes=" in str(error))
    model.checkpoint = True
    step(8, 256)
    reference = [p.grad.clone() for p in model.parameters()]
    model.checkpoint = False
    sized = stowage.plan.profile(step, sizes={"batch": (2, 3), "seq": (32, 64, 96)}, cost=COST)
    budget = 40 << 20
    plan = stowage.plan.solve(sized, budget, at={"batch": 8, "seq": 256})
    model.zero_grad(set_to_none=True)
    stowage.mark_step()
    start = stowage.memory_allocated("cpu")
    stowage.reset_peak_stats("cpu")
    with plan:
        loss = step(8, 256)
    peak = stowage.max_memory_allocated("cpu") - start
    same = all(torch.equal(p.grad, r) for p, r in zip(model.parameters(), reference))
    print("planned:", plan.fits, torch.isfinite(loss).item(), same, peak <= budget * 1.15, plan.mismatches)
"""


def test_a_model_that_runs_out_of_memory_is_profiled_small_and_trains_under_its_plan() -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(OUT_OF_MEMORY)], capture_output=True, text=True,
                          timeout=300, cwd=HERE)
    assert done.returncode == 0, done.stderr
    lines: list[Any] = done.stdout.splitlines()
    assert lines == ["plain: out of memory", "profile: True", "planned: True True True True []"], done.stdout


def test_a_cost_model_names_its_prefetch_depth_and_nothing_else(tmp_path: Path) -> None:
    document = small_profile(blocks=4)
    document["cost"]["prefetch_pages"] = document["cost"].pop("prefetch_depth")
    path = tmp_path / "renamed.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match="cost: unknown field 'prefetch_pages'"):
        stowage.plan.load_trace(path)
