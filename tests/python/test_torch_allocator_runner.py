"""The comparison behind tests/gpu/torch_allocator_tests/run.py (PyTorch's allocator tests under
torch's allocator and under stowage), on canned JUnit results: a test passing under torch's
allocator and not under stowage is a regression unless native_only.txt lists it, a test missing
from one run is reported (and counts as not passing there), and run.py's own outcomes (crashed,
timeout, not-run) survive the JUnit round trip. Also the listings themselves: the native-only list
keeps within its bound and every entry is selected."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "gpu" / "torch_allocator_tests"


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"torch_allocator_tests_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


outcomes = _module("outcomes")


def junit(tmp_path: Path, name: str, cases: str) -> Path:
    """A JUnit XML file as pytest writes one (classname: path.module.Class)."""
    path = tmp_path / name
    path.write_text(f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">{cases}'
                    "</testsuite></testsuites>")
    return path


def case(name: str, body: str = "", classname: str = "test_cuda.TestCuda") -> str:
    return f'<testcase classname="{classname}" name="{name}" time="0.5">{body}</testcase>'


TORCH_RUN = "".join([
    case("test_memory_stats"),
    case("test_out_of_memory"),
    case("test_allocator_settings", classname="test_cuda.TestCudaMallocAsync"),
    case("test_lazy_init"),
    case("test_graph_capture_simple"),
    case("test_cycles", '<failure message="AssertionError: False is not true">trace</failure>'),
    case("test_uuid", '<skipped type="pytest.skip" message="no pynvml">skip</skipped>'),
])
STOWAGE_RUN = "".join([
    case("test_memory_stats"),
    case("test_out_of_memory", '<failure message="AssertionError: &quot;Tried to allocate&quot; does not match">x'
                               "</failure>"),
    case("test_allocator_settings", '<failure message="AssertionError: 88080384 != 100663296">x</failure>',
         classname="test_cuda.TestCudaMallocAsync"),
    case("test_graph_capture_simple"),
    case("test_cycles"),
    case("test_uuid", '<skipped type="pytest.skip" message="no pynvml">skip</skipped>'),
])
NATIVE_ONLY = {"TestCudaMallocAsync::test_allocator_settings": "native rounding knob"}


def compared(tmp_path: Path) -> Any:
    torch = outcomes.read_junit(junit(tmp_path, "torch.xml", TORCH_RUN))
    stowage = outcomes.read_junit(junit(tmp_path, "stowage.xml", STOWAGE_RUN))
    return torch, stowage, outcomes.compare(torch, stowage, NATIVE_ONLY)


def test_a_test_passing_under_torch_and_failing_under_stowage_is_a_regression(tmp_path: Path) -> None:
    _, stowage, comparison = compared(tmp_path)
    assert [row.test for row in comparison.regressions] == ["TestCuda::test_lazy_init", "TestCuda::test_out_of_memory"]
    oom = next(row for row in comparison.rows if row.test == "TestCuda::test_out_of_memory")
    assert (oom.torch, oom.stowage) == ("passed", "failed") and "Tried to allocate" in oom.message
    assert comparison.rows[0].verdict == "regression"  # regressions head the table


def test_a_listed_native_only_test_is_accepted(tmp_path: Path) -> None:
    _, _, comparison = compared(tmp_path)
    settings = next(row for row in comparison.rows if row.test == "TestCudaMallocAsync::test_allocator_settings")
    assert settings.verdict == "native-only"
    unlisted = outcomes.compare(*compared(tmp_path)[:2], {})
    assert "TestCudaMallocAsync::test_allocator_settings" in [row.test for row in unlisted.regressions]


def test_a_test_missing_from_one_run_is_reported(tmp_path: Path) -> None:
    torch, stowage, comparison = compared(tmp_path)
    lazy = next(row for row in comparison.rows if row.test == "TestCuda::test_lazy_init")
    assert (lazy.torch, lazy.stowage) == ("passed", outcomes.ABSENT) and lazy.verdict == "regression"
    page = outcomes.markdown(comparison, torch, stowage, NATIVE_ONLY, ["test file: canned"])
    assert "| TestCuda::test_lazy_init | passed | absent | regression |" in page
    only_in_stowage = outcomes.compare({}, {"TestCuda::test_x": outcomes.Outcome("passed")}, {})
    assert [(row.torch, row.verdict) for row in only_in_stowage.rows] == [(outcomes.ABSENT, "absent from a run")]


def test_other_verdicts_and_the_table(tmp_path: Path) -> None:
    torch, stowage, comparison = compared(tmp_path)
    verdicts = {row.test: row.verdict for row in comparison.rows}
    assert verdicts["TestCuda::test_cycles"] == "passes under stowage only"
    assert verdicts["TestCuda::test_memory_stats"] == verdicts["TestCuda::test_uuid"] == "same"
    page = outcomes.markdown(comparison, torch, stowage, NATIVE_ONLY, ["test file: canned"])
    assert "- torch's allocator: 5 passed, 1 failed, 1 skipped" in page
    assert "- regression: 2 (TestCuda::test_lazy_init, TestCuda::test_out_of_memory)" in page
    assert "- TestCudaMallocAsync::test_allocator_settings: native rounding knob" in page


def test_runner_outcomes_survive_the_junit_round_trip(tmp_path: Path) -> None:
    written = {"TestCuda::test_a": outcomes.Outcome("crashed", 45.0, "the process ended (status -11) in this test"),
               "TestCuda::test_b": outcomes.Outcome("timeout", 45.0, "over the run's time limit"),
               "TestCuda::test_c": outcomes.Outcome("not-run", 0.0, "no time left"),
               "TestCuda::test_d": outcomes.Outcome("failed", 1.0, "AssertionError"),
               "TestCuda::test_e": outcomes.Outcome("xfailed", 1.0, "expected"),
               "TestCuda::test_f": outcomes.Outcome("passed", 1.0)}
    outcomes.write_junit(written, tmp_path / "pass.xml", "stowage pass 1")
    assert outcomes.read_junit(tmp_path / "pass.xml") == written
    interrupted = junit(tmp_path, "bound.xml", case("test_g", '<failure message="runner_plugin.OverTimeBound: over '
                                                              'the per-test bound of 45 s">x</failure>'))
    assert outcomes.read_junit(interrupted)["TestCuda::test_g"].outcome == "timeout"
    # a test reported twice (its call passed, its teardown errored) keeps the worse
    twice = junit(tmp_path, "twice.xml", case("test_h") + case("test_h", '<error message="teardown">x</error>'))
    assert outcomes.read_junit(twice)["TestCuda::test_h"].outcome == "error"


def test_the_native_only_list_is_bounded_has_reasons_and_is_selected(tmp_path: Path) -> None:
    native = outcomes.read_native_only(HARNESS / "native_only.txt")
    selection = outcomes.read_listing(HARNESS / "selection.txt")
    assert 0 < len(native) <= outcomes.MAX_NATIVE_ONLY and all(native.values())
    assert set(native) <= set(selection) and len(selection) == len(set(selection))
    too_many = tmp_path / "native_only.txt"
    too_many.write_text("".join(f"TestCuda::test_{k} | reason {k}\n" for k in range(outcomes.MAX_NATIVE_ONLY + 1)))
    with pytest.raises(ValueError, match="more than 10"):
        outcomes.read_native_only(too_many)
    too_many.write_text("TestCuda::test_a\n")
    with pytest.raises(ValueError, match="has no reason"):
        outcomes.read_native_only(too_many)


# A stand-in for torch's test_cuda.py (no torch, no GPU): tests that pass, one that fails only
# under stowage, one that kills its process under stowage, one that hangs in a way SIGALRM cannot
# interrupt, one the per-test bound interrupts, and one no run has time for.
STAND_IN = '''
import os, signal, time, unittest

UNDER_STOWAGE = "STOWAGE_ALLOC_CONF" in os.environ


class TestCuda(unittest.TestCase):
    def test_a_passes(self):
        pass

    def test_b_differs(self):
        self.assertFalse(UNDER_STOWAGE, "only under stowage")

    def test_c_crashes(self):
        if UNDER_STOWAGE:
            os._exit(3)

    def test_d_hangs_in_c(self):
        if UNDER_STOWAGE:
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
            time.sleep(60)

    def test_e_native_only(self):
        self.assertFalse(UNDER_STOWAGE)

    def test_f_slow(self):
        if UNDER_STOWAGE:
            time.sleep(60)  # (SIGALRM interrupts it)

    def test_g_after(self):
        pass

    def test_h_unselected(self):
        raise AssertionError("not selected: never run")
'''


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tests = tmp_path / "torch-tests"
    tests.mkdir()
    (tests / "test_cuda.py").write_text(STAND_IN)
    (tests / "SOURCE").write_text("pytorch/pytorch v0.0.0 test/test_cuda.py\n")
    (tmp_path / "selection.txt").write_text("# selected\n" + "".join(
        f"TestCuda::test_{name}\n" for name in ("a_passes", "b_differs", "c_crashes", "d_hangs_in_c", "e_native_only",
                                                 "f_slow", "g_after", "z_not_in_the_file")))
    (tmp_path / "native_only.txt").write_text("TestCuda::test_e_native_only | a native knob\n")
    monkeypatch.setenv("STOWAGE_TORCH_TESTS_GRACE_S", "2")
    return tmp_path


def run_harness(root: Path, *extra: str) -> int:
    run = _module("run")
    return run.main(["--out", str(root / "out"), "--tests", str(root / "torch-tests"), "--selection",
                     str(root / "selection.txt"), "--native-only", str(root / "native_only.txt"), *extra])


def test_the_runner_survives_crashes_and_hangs_and_compares_test_by_test(stand_in: Path) -> None:
    status = run_harness(stand_in, "--per-test-s", "2", "--budget-s", "120")
    page = (stand_in / "out" / "comparison.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:4] for line in page.splitlines()
            if line.startswith("| TestCuda::")}
    assert status == 1
    assert rows["TestCuda::test_a_passes"] == ["passed", "passed", "same"]
    assert rows["TestCuda::test_b_differs"] == ["passed", "failed", "regression"]
    assert rows["TestCuda::test_c_crashes"] == ["passed", "crashed", "regression"]
    assert rows["TestCuda::test_d_hangs_in_c"] == ["passed", "timeout", "regression"]
    assert "| TestCuda::test_d_hangs_in_c | passed | timeout | regression | stuck past the per-test bound" in page
    assert rows["TestCuda::test_e_native_only"] == ["passed", "failed", "native-only"]
    assert rows["TestCuda::test_f_slow"] == ["passed", "timeout", "regression"]
    assert rows["TestCuda::test_g_after"] == ["passed", "passed", "same"]  # run in a later process
    assert "test_h_unselected" not in page
    assert "selected but not in the file: TestCuda::test_z_not_in_the_file" in page
    passes = sorted(path.name for path in (stand_in / "out").glob("stowage-pass*.xml"))
    assert passes == ["stowage-pass1.xml", "stowage-pass2.xml", "stowage-pass3.xml"]


def test_the_runner_says_when_the_file_is_not_the_installed_torch_s(stand_in: Path) -> None:
    run_harness(stand_in, "--per-test-s", "2", "--budget-s", "14")
    page = (stand_in / "out" / "comparison.md").read_text()
    assert "test file: pytorch/pytorch v0.0.0 test/test_cuda.py (NOT torch" in page


def test_the_runner_marks_tests_without_time_as_not_run(stand_in: Path) -> None:
    run_harness(stand_in, "--per-test-s", "2", "--budget-s", "14")
    page = (stand_in / "out" / "comparison.md").read_text()
    assert "not-run" in page
