"""The planner's files fuzzed (tests/python/plan_files_fuzzer.py): seeded random mutations of a
valid lifetime trace, sized trace and plan, 1,000 a kind, each read as a user would under a 1 GiB
address-space cap, must end in a result or a refusal naming the file: no traceback, no case
slower than the readers' bound (10 s), no run over its memory cap.

Longer runs: STOWAGE_FUZZ_CASES=100000 (and STOWAGE_FUZZ_SEED to vary the seed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FUZZER = Path(__file__).parent / "plan_files_fuzzer.py"
CASES = int(os.environ.get("STOWAGE_FUZZ_CASES", "1000"))
SEED = int(os.environ.get("STOWAGE_FUZZ_SEED", "20261126"))
MEMORY_MIB = 1024
SLOWEST_S = 10.0


@pytest.mark.parametrize("kind", ["profile", "sized", "plan"])
def test_mutated_planner_files_end_in_a_result_or_a_named_refusal(kind: str) -> None:
    done = subprocess.run([sys.executable, str(FUZZER), kind, str(SEED), str(CASES), "--memory-mib", str(MEMORY_MIB)],
                          capture_output=True, text=True, timeout=600 + CASES // 10)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    outcomes = report["outcomes"]
    assert sum(outcomes.values()) == CASES
    assert "traceback" not in outcomes, json.dumps(report["failures"], indent=1)[:6000]
    assert outcomes.get("refused", 0) > CASES // 2 and CASES - outcomes.get("refused", 0) > CASES // 50, outcomes
    assert report["slowest_s"] < SLOWEST_S, report
    assert report["peak_rss_mib"] < MEMORY_MIB, report
