"""stowage diff: growth and shrinkage by site and by segment between two snapshots recorded in
CPU mode, nothing between a snapshot and itself, and clear failures on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, SHARED_TRACES, stowage

MiB = 1 << 20


def test_a_site_that_grew_and_one_that_shrank(tmp_path: Path) -> None:
    program = tmp_path / "train.py"
    program.write_text(textwrap.dedent(f"""
        import torch, stowage
        stowage.enable(device="cpu", capacity="256MiB")
        stowage.record_history(True)
        def weights():
            return [torch.empty(4 << 20, dtype=torch.uint8) for _ in range(3)]
        def activations():
            return [torch.empty(6 << 20, dtype=torch.uint8) for _ in range(2)]
        kept = weights()
        stowage.dump_snapshot({str(tmp_path / 'a.pickle')!r})
        del kept[0]
        more = activations()
        stowage.dump_snapshot({str(tmp_path / 'b.pickle')!r})
    """))
    made = subprocess.run([sys.executable, str(program)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    lines = program.read_text().splitlines()
    weights_line = next(i for i, text in enumerate(lines, 1) if "4 << 20" in text)
    activations_line = next(i for i, text in enumerate(lines, 1) if "6 << 20" in text)

    result = stowage("diff", str(tmp_path / "a.pickle"), str(tmp_path / "b.pickle"), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["totals"]["allocated"]["change"] == 12 * MiB - 4 * MiB
    grew = report["sites_grew"]
    assert len(grew) == 1 and f"train.py:{activations_line} " in grew[0]["site"]
    assert grew[0]["before"] == 0 and grew[0]["change"] == 12 * MiB
    shrank = report["sites_shrank"]
    assert len(shrank) == 1 and f"train.py:{weights_line} " in shrank[0]["site"]
    assert shrank[0]["change"] == -4 * MiB
    text = stowage("diff", str(tmp_path / "a.pickle"), str(tmp_path / "b.pickle")).stdout
    assert "grew, by site" in text and "shrank, by site" in text and "+12.00 MiB" in text


TRACES = sorted((REPO / "bench" / "traces").glob("*.pickle.gz")) + sorted(SHARED_TRACES.glob("*.pickle"))


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_a_snapshot_against_itself_changes_nothing(trace: Path) -> None:
    result = stowage("diff", str(trace), str(trace), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sites_grew"] == [] and report["sites_shrank"] == []
    assert report["segments"]["changed_count"] == 0
    assert all(row["change"] in (0, None) for row in report["totals"].values())


def test_bad_input_ends_in_a_message(tmp_path: Path) -> None:
    good = next((REPO / "bench" / "traces").glob("*.pickle.gz"))
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle")
    for args in ((str(good), str(bad)), (str(tmp_path / "missing"), str(good)),
                 (str(good), str(good), "--device", "5")):
        result = stowage("diff", *args)
        assert result.returncode == 2, args
        assert "stowage diff:" in result.stderr and "Traceback" not in result.stderr
