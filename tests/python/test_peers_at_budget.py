"""bench/e2e/peers_at_budget.py, which a GPU machine runs (tests/gpu/run.sh's peers stage), at its
dry run's smallest point here, so that a change that breaks it shows up before the rare GPU run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from conftest import REPO

E2E = REPO / "bench" / "e2e"
sys.path.insert(0, str(E2E))

from decoder_ladder import QWEN25, TINY, ladder  # noqa: E402
from peers_at_budget import next_rung, row  # noqa: E402


def test_the_ladder_counts_the_parameters_transformers_builds() -> None:
    """Each rung's parameter count (which places the predicted points and the table's figures) is
    Qwen2ForCausalLM's, tied and untied, named and deepened."""
    rungs = ladder(TINY)
    assert [r.parameters() for r in rungs] == sorted(r.parameters() for r in rungs)
    for shape in (QWEN25[0], QWEN25[3], rungs[1], TINY[-1]):
        with torch.device("meta"):
            model = Qwen2ForCausalLM(shape.config(128))
        assert sum(p.numel() for p in model.parameters()) == shape.parameters(), shape.name


def test_the_dry_run_trains_the_smallest_point_under_fit_and_tables_it(tmp_path: Path) -> None:
    """The stowage row at the smallest rung, in CPU mode: it trains in a fresh process, every step
    timed, within the budget, the host bytes a parameter measured; the parameter-offload row and a
    peer that needs CUDA say why they did not run; the Markdown table holds the rows."""
    output, table = tmp_path / "peers.json", tmp_path / "peers.md"
    done = subprocess.run([sys.executable, str(E2E / "peers_at_budget.py"), "--device", "cpu", "--small",
                           "--budgets", "64MiB", "--rungs", "tiny-a", "--steps", "2", "--budget-s", "120",
                           "--systems", "stowage-fit", "stowage-fit+parameters", "torchao-offload",
                           "--json", str(output), "--markdown", str(table)],
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    search = json.loads(output.read_text())["searches"][0]
    assert search["budget_bytes"] == 64 << 20
    fitted = search["rows"]["stowage-fit"]
    best = fitted["largest"]
    assert best is not None, fitted["bounded_by"]
    assert best["model"] == "tiny-a" and best["fits"] is True
    assert len(best["step_s"]) == 2 and all(t > 0 for t in best["step_s"])
    assert all(math.isfinite(loss) for loss in best["losses"]) and best["tokens_per_s"] > 0
    assert 0 < best["peak_reserved_bytes"] <= 64 << 20
    assert best["host_bytes_per_parameter"] > 0
    assert fitted["bounded_by"] == "the ladder's largest rung trained"  # the only rung: nothing above it to try
    parameters_row = search["rows"]["stowage-fit+parameters"]
    assert parameters_row["largest"] is not None or "stowage" in parameters_row["bounded_by"]
    assert "needs CUDA" in search["rows"]["torchao-offload"]["bounded_by"]
    text = table.read_text()
    assert "| 64MiB | stowage-fit | tiny-a |" in text and "| 64MiB | torchao-offload | none |" in text


def test_the_bracket_closes_on_both_sides_of_a_wrong_prediction() -> None:
    """peers_at_budget's search a rung at a time: from a prediction below the answer it climbs
    until a rung does not train, from one above it it descends until one does, and it stops at the
    ladder's top and after a point that was not run; each rung is tried once, and the row names the
    largest that trained and the smallest above it that did not, with why."""
    rungs = len(ladder(TINY))
    for answer in (0, 6, rungs - 1):
        for predicted in (0, 2, 6, 10, rungs - 1):
            points = [point_at(predicted, answer)]
            while (index := next_rung(points, rungs)) is not None:
                assert index not in [p["rung"] for p in points]
                points.append(point_at(index, answer))
            entry = row("s", "64MiB", "predicted", points, rungs)
            if answer == rungs - 1:
                assert entry["largest"]["rung"] == answer and entry["smallest_not"] is None
                assert entry["bounded_by"] == "the ladder's largest rung trained"
            else:
                assert entry["largest"]["rung"] == answer
                assert entry["smallest_not"]["rung"] == answer + 1
                assert entry["bounded_by"] == f"r{answer + 1}: out of memory"
    stopped = [point_at(3, 6), {**point_at(4, 6), "fits": None, "why": "not run: the run's time budget was spent"}]
    assert next_rung(stopped, rungs) is None
    assert row("s", "64MiB", "r3", stopped, rungs)["bounded_by"] == "r4: not run: the run's time budget was spent"


def point_at(index: int, answer: int) -> dict:
    """A point of a system that trains every rung up to `answer`."""
    return {"system": "s", "rung": index, "model": f"r{index}", "fits": index <= answer, "why": "out of memory"}
