"""``stowage plan TRACE --budget SIZE``: a lifetime trace file planned from the command line, as
text and as JSON, the plan saved for stowage.plan.load; bad files and budgets refused with their
reason; and predicted peaks that never grow as the budget shrinks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import stowage.plan

pytest.importorskip("torch")


pytestmark = pytest.mark.usefixtures("cpu_mode_module")


# test_plan's gpt_step recorded once with its COST. A fixed profile, not one recorded per run: the
# solver is deterministic given a profile, but op times measured on a loaded machine change which
# of plans predicted equally fast it finds, and with them the sweep's peaks
# (bench/results/2026-11-24-cpu-plan-monotonicity.md).
RECORDED = Path(__file__).parent / "data" / "gpt_step.lifetimes.json"


@pytest.fixture(scope="module")
def profile_path() -> Path:
    return RECORDED


def stowage_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stowage", "plan", *args], capture_output=True, text=True,
                          timeout=120)


def test_the_command_prints_decisions_by_module_and_the_comparison_points(profile_path: Path) -> None:
    done = stowage_plan(str(profile_path), "--budget", "50%")
    assert done.returncode == 0, done.stderr
    for part in ("fits", "blocks.*", "keep", "offload", "recompute", "no change", "full checkpointing",
                 "offload everything"):
        assert part in done.stdout, f"missing {part!r} in\n{done.stdout}"


def test_json_output_and_the_saved_plan_agree_with_the_library(profile_path: Path, tmp_path: Path) -> None:
    profile = stowage.plan.load_trace(profile_path)
    done = stowage_plan(str(profile_path), "--budget", "30%", "--json", "--save", str(tmp_path / "plan.json"))
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    budget = int(profile.unconstrained_peak_bytes * 0.3)
    assert report["budget_bytes"] == budget and report["fits"]
    assert set(report["outcomes"]) == {"plan", "no change", "full checkpointing", "offload everything"}
    assert report["outcomes"]["plan"]["peak_bytes"] <= budget
    assert report["decisions"] == [d.name for d in stowage.plan.solve(profile, budget).decisions]
    assert [d.name for d in stowage.plan.load(tmp_path / "plan.json").decisions] == report["decisions"]
    kept = sum(row["keep"] for row in report["by_module"].values())
    assert 0 < kept < sum(t.bytes for t in profile.tensors)


def test_a_budget_nothing_fits_exits_1_and_bad_input_exits_2(profile_path: Path, tmp_path: Path) -> None:
    assert stowage_plan(str(profile_path), "--budget", "1KiB").returncode == 1
    for budget, reason in (("lots", "lots"), ("x%", "not a percentage"), ("0", "positive")):
        done = stowage_plan(str(profile_path), "--budget", budget)
        assert done.returncode == 2 and reason in done.stderr, done.stderr
    (tmp_path / "bad.json").write_text("{}")
    done = stowage_plan(str(tmp_path / "bad.json"), "--budget", "1GiB")
    assert done.returncode == 2 and "bad.json" in done.stderr


def test_a_smaller_budget_never_predicts_a_larger_peak(profile_path: Path) -> None:
    profile = stowage.plan.load_trace(profile_path)
    peaks = []
    for percent in range(95, 20, -5):
        plan = stowage.plan.solve(profile, int(profile.unconstrained_peak_bytes * percent / 100))
        peaks.append(plan.predicted_peak_bytes)
    assert all(later <= earlier for earlier, later in zip(peaks, peaks[1:])), peaks
