#!/usr/bin/env python3
"""Runs PyTorch's own allocator tests (selection.txt, from torch's test/test_cuda.py) twice, each
in fresh processes: under torch's allocator, then with stowage as torch's CUDA allocator
(STOWAGE_ALLOC_CONF= ), and compares them test by test (outcomes.py).

    python3 tests/gpu/torch_allocator_tests/run.py --out DIR [--tests .gpu-deps/torch-tests]
        [--budget-s 200] [--per-test-s 45] [--collect-only]

The test file is PyTorch's, best at the release of the installed torch: `--tests` names a folder
holding test_cuda.py and SOURCE, whose first line is `pytorch/pytorch <tag or commit>
test/test_cuda.py` (tools/fetch-gpu-deps writes both, with PyTorch's LICENSE beside them, where
GitHub can be reached; elsewhere put them there by hand). The file is not part of stowage's tree.
A file of another revision still compares the two allocators on the same tests, so it runs, and
the table's header says that it is not the installed torch's (tests the newer file has and this
torch lacks fail under both allocators alike and are no regression). torch's testing helpers need
`expecttest` (a wheel in .gpu-deps/wheels).

Each run is one pytest process, or more: a test that kills its process or hangs in C past the
per-test bound is recorded (crashed, timeout) and the tests left go on in a new process. Torch's
run gets at most half of --budget-s, stowage's what is left; tests that get no time are not-run.
Writes into DIR: each pass's JUnit XML and log, comparison.md (the table) and comparison.json.
Exits 1 when a test passing under torch's allocator does not pass under stowage and is not in
native_only.txt, when a selected test is missing from the file, or when a run's allocator was not
the one asked for (a stowage run that did not install stowage); 2 when it cannot run at all.

--collect-only: collects the selection in one process (no GPU needed; the tests skip without
one) and reports the selected tests the file lacks; exit 1 if any.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from outcomes import (Outcome, compare, markdown, read_junit, read_listing, read_native_only,  # noqa: E402
                      write_junit)

REPO = HERE.parents[2]
ALLOCATORS = {"torch": "native", "stowage": "stowage"}  # run -> torch.cuda.get_allocator_backend()
CLEARED = ("STOWAGE_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


@dataclass
class Run:
    """One allocator's run: its outcomes so far, the backend it saw, what the file lacked."""
    name: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    backend: str | None = None
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="results folder")
    parser.add_argument("--tests", type=Path, default=REPO / ".gpu-deps" / "torch-tests",
                        help="folder holding test_cuda.py and SOURCE")
    parser.add_argument("--budget-s", type=float, default=200.0, help="both runs together")
    parser.add_argument("--per-test-s", type=float, default=45.0, help="each test's time bound")
    parser.add_argument("--collect-only", action="store_true")
    parser.add_argument("--selection", type=Path, default=HERE / "selection.txt", help=argparse.SUPPRESS)
    parser.add_argument("--native-only", type=Path, default=HERE / "native_only.txt", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def source_line(tests: Path) -> str:
    """SOURCE's first line, and a note when it does not name the installed torch's release."""
    source = tests / "SOURCE"
    if not (tests / "test_cuda.py").exists() or not source.exists():
        raise SystemExit(f"run.py: no {tests}/test_cuda.py with its SOURCE; tools/fetch-gpu-deps fetches "
                         f"PyTorch's test/test_cuda.py at the installed torch's release (see {HERE}/run.py)")
    line = source.read_text().splitlines()[0].strip()
    torch_version = metadata.version("torch").split("+")[0]
    if f"v{torch_version}" not in line.split():
        return f"{line} (NOT torch {torch_version}'s release: tests differ where the file is newer or older)"
    return line


def pytest_command(tests: Path, out: Path, junit: Path | None, collect_only: bool) -> list[str]:
    ini = out / "pytest.ini"
    ini.write_text("[pytest]\n")  # the repository's settings are not for torch's tests
    command = [sys.executable, "-m", "pytest", str(tests / "test_cuda.py"), "-c", str(ini), "--rootdir",
               str(tests), "-p", "runner_plugin", "-p", "no:cacheprovider", "-q", "-rN"]
    if collect_only:
        command.append("--collect-only")
    if junit is not None:
        command.append(f"--junitxml={junit}")
    return command


def environment(run: str, selection: Path, progress: Path, done: Path, per_test_s: float) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    if run == "stowage":
        env["STOWAGE_ALLOC_CONF"] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env.update(STOWAGE_TORCH_TESTS_SELECTION=str(selection), STOWAGE_TORCH_TESTS_PROGRESS=str(progress),
               STOWAGE_TORCH_TESTS_DONE=str(done), STOWAGE_TORCH_TESTS_BOUND_S=str(per_test_s),
               PYTHONUNBUFFERED="1")
    return env


def read_progress(progress: Path) -> list[dict]:
    if not progress.exists():
        return []
    return [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]


def run_process(command: list[str], env: dict[str, str], log: Path, limit_s: float, cwd: Path) -> int | None:
    """The process's exit status, or None when it ran past limit_s (it and its children killed)."""
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                   start_new_session=True)
        try:
            return process.wait(timeout=max(limit_s, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None


def one_pass(run: Run, k: int, args: argparse.Namespace, limit_s: float) -> bool:
    """Runs the tests `run` has no outcome for yet; False when the pass made no progress."""
    out = args.out
    junit, progress, done = (out / f"{run.name}-pass{k}.xml", out / f"{run.name}-pass{k}.progress",
                             out / f"{run.name}-pass{k}.done")
    done.write_text("".join(f"{key}\n" for key in run.outcomes))
    status = run_process(pytest_command(args.tests, out, junit, False),
                         environment(run.name, args.selection, progress, done, args.per_test_s),
                         out / f"{run.name}-pass{k}.log", limit_s, args.tests)
    records = read_progress(progress)
    for record in records:
        if record["event"] == "collected" and k == 1:
            run.missing = record["missing"]
        elif record["event"] == "backend" and run.backend is None:
            run.backend = record["name"]
    started = [r["id"] for r in records if r["event"] == "start"]
    finished = {r["id"]: Outcome(r["outcome"], r["seconds"], r["message"]) for r in records if r["event"] == "done"}
    if junit.exists() and status is not None:
        finished.update(read_junit(junit))  # pytest's own, where it wrote them
    in_flight = [key for key in started if key not in finished]
    if in_flight:  # the process died in it, or was stopped
        if status is None:
            kind, reason = "timeout", "the run's time ran out in this test"
        elif _hard_stop(progress):
            kind, reason = "timeout", f"stuck past the per-test bound, stopped (stacks: {progress.name}.stacks)"
        else:
            kind, reason = "crashed", f"the process ended (status {status}) in this test; see {junit.stem}.log"
        finished[in_flight[-1]] = Outcome(kind, args.per_test_s, reason)
    if not junit.exists() or status is None or in_flight:
        write_junit(finished, junit, f"{run.name} pass {k}")
    if not any(r["event"] == "collected" for r in records):
        run.problems.append(f"pass {k} collected nothing (exit status {status}): see {run.name}-pass{k}.log")
    run.outcomes.update(finished)
    return bool(finished)


def _hard_stop(progress: Path) -> bool:
    stacks = Path(f"{progress}.stacks")
    return stacks.exists() and "Timeout" in stacks.read_text(errors="replace")


def run_allocator(name: str, args: argparse.Namespace, selection: list[str], deadline: float) -> Run:
    run = Run(name)
    for k in range(1, len(selection) + 2):
        left = deadline - time.monotonic()
        if left < 5 or not one_pass(run, k, args, left):
            break
        wanted = set(selection) - set(run.missing)
        if wanted <= set(run.outcomes) or run.problems:
            break
    for key in sorted(set(selection) - set(run.missing) - set(run.outcomes)):
        run.outcomes[key] = Outcome("not-run", 0.0, "no time left in the run's budget")
    if run.backend is not None and run.backend != ALLOCATORS[name]:
        run.problems.append(f"the {name} run's allocator was {run.backend!r}, not {ALLOCATORS[name]!r}")
    return run


def collect_only(args: argparse.Namespace) -> int:
    progress = args.out / "collect.progress"
    progress.unlink(missing_ok=True)
    status = run_process(pytest_command(args.tests, args.out, None, True),
                         environment("torch", args.selection, progress, args.out / "collect.done", 0),
                         args.out / "collect.log", 600, args.tests)
    records = [r for r in read_progress(progress) if r["event"] == "collected"]
    if not records:
        print(f"run.py: collection failed (exit status {status}); see {args.out / 'collect.log'}")
        return 1
    print(f"{len(records[0]['ids'])} selected tests collected; missing from the file: {records[0]['missing'] or 'none'}")
    return 1 if records[0]["missing"] else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.tests = args.tests.resolve()
    source = source_line(args.tests)
    selection = read_listing(args.selection)
    native_only = read_native_only(args.native_only)
    unknown = sorted(set(native_only) - set(selection))
    if unknown:
        raise SystemExit(f"run.py: native_only.txt lists tests not in selection.txt: {unknown}")
    if args.collect_only:
        return collect_only(args)
    start = time.monotonic()
    torch_run = run_allocator("torch", args, selection, start + args.budget_s / 2)
    stowage_run = run_allocator("stowage", args, selection, start + args.budget_s)
    comparison = compare(torch_run.outcomes, stowage_run.outcomes, native_only)
    missing = sorted(set(torch_run.missing) | set(stowage_run.missing))
    problems = torch_run.problems + stowage_run.problems
    header = [f"test file: {source}", f"torch {metadata.version('torch')}; {len(selection)} tests selected; "
              f"both runs in {time.monotonic() - start:.0f} s (budget {args.budget_s:.0f} s, {args.per_test_s:.0f} s a test)"]
    header += [f"selected but not in the file: {', '.join(missing)}"] if missing else []
    header += [f"PROBLEM: {problem}" for problem in problems]
    (args.out / "comparison.md").write_text(markdown(comparison, torch_run.outcomes, stowage_run.outcomes,
                                                     native_only, header))
    (args.out / "comparison.json").write_text(json.dumps(
        {"header": header, "rows": [asdict(row) for row in comparison.rows]}, indent=1))
    regressions = comparison.regressions
    print(f"torch's allocator tests under stowage: {len(regressions)} regressions, "
          f"{len(comparison.of('native-only'))} native-only, {len(missing)} missing, {len(problems)} problems "
          f"(table: {args.out / 'comparison.md'})")
    for row in regressions:
        print(f"  REGRESSION {row.test}: torch {row.torch}, stowage {row.stowage}: {row.message}")
    for problem in problems:
        print(f"  PROBLEM {problem}")
    return 1 if regressions or missing or problems else 0


if __name__ == "__main__":
    sys.exit(main())
