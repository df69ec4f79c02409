"""pytest plugin for one pass of run.py (loaded with `-p runner_plugin`; its settings come in the
environment, where run.py puts them):

- STOWAGE_TORCH_TESTS_SELECTION: a file of `Class::test` lines; every other collected test is
  deselected, and so is each listed in STOWAGE_TORCH_TESTS_DONE (run by an earlier pass);
- STOWAGE_TORCH_TESTS_BOUND_S: each test's time bound. At the bound the test is interrupted
  (OverTimeBound, raised by SIGALRM between Python bytecodes); 15 s later
  (STOWAGE_TORCH_TESTS_GRACE_S), if it is stuck in C
  (a synchronisation that never returns), faulthandler prints every thread's stack and ends the
  process, and run.py goes on with the tests left in a new one;
- STOWAGE_TORCH_TESTS_PROGRESS: a JSON-lines log, written as the pass goes, so that run.py knows
  what ran when the process dies before pytest writes its JUnit XML: `collected` (the tests kept
  and the listed ones the file lacks), `backend` (torch's allocator backend, once torch is
  imported), `start` and `done` (outcome, seconds, message) of each test.

Stdlib and pytest only.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HARD_STOP_GRACE_S = float(os.environ.get("STOWAGE_TORCH_TESTS_GRACE_S", "15"))


class OverTimeBound(BaseException):
    """A test ran past its bound (a BaseException, so that tests catching Exception do not hide it)."""


def _id(item: pytest.Item) -> str:
    return "::".join(item.nodeid.split("::")[1:])


def _lines(variable: str) -> set[str]:
    path = os.environ.get(variable)
    if not path or not Path(path).exists():
        return set()
    return {line.split("#", 1)[0].strip() for line in Path(path).read_text().splitlines()} - {""}


def _log(**record: Any) -> None:
    path = os.environ.get("STOWAGE_TORCH_TESTS_PROGRESS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = _lines("STOWAGE_TORCH_TESTS_SELECTION") - _lines("STOWAGE_TORCH_TESTS_DONE")
    kept = [item for item in items if _id(item) in wanted]
    config.hook.pytest_deselected(items=[item for item in items if _id(item) not in wanted])
    items[:] = kept
    _log(event="collected", ids=[_id(item) for item in kept],
         missing=sorted(wanted - {_id(item) for item in items}))


_state: dict[str, Any] = {"backend_logged": False, "results": {}}

# Names a test file newer than the installed torch imports from torch's testing helpers, with the
# value the newer helpers give them; a name the installed torch has is left as it is.
NEWER_HELPER_NAMES = {
    "torch.testing._internal.common_cuda": {
        "TEST_CUDAMALLOCASYNC": lambda torch: torch.cuda.get_allocator_backend() == "cudaMallocAsync",
    },
}


def pytest_configure(config: pytest.Config) -> None:
    """Defines NEWER_HELPER_NAMES missing from the installed torch before the test file imports
    them, so a file one release apart still collects (its other tests are the same). Helpers that
    do not import (expecttest missing) are left alone: the test file's own import then says so."""
    import importlib

    torch = importlib.import_module("torch")
    for module_name, names in NEWER_HELPER_NAMES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, value_of in names.items():
            if not hasattr(module, name):
                setattr(module, name, value_of(torch))


def _stacks_file() -> Any:
    """Where a hard stop prints the stacks: a file beside the progress log (pytest captures the
    process's stderr, and a process that ends loses what was captured)."""
    if "stacks" not in _state:
        path = os.environ.get("STOWAGE_TORCH_TESTS_PROGRESS")
        _state["stacks"] = open(f"{path}.stacks" if path else os.devnull, "a", encoding="utf-8")
    return _state["stacks"]


def _on_alarm(signum: int, frame: Any) -> None:
    raise OverTimeBound(f"over the per-test bound of {os.environ.get('STOWAGE_TORCH_TESTS_BOUND_S')} s")


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    torch = sys.modules.get("torch")
    if not _state["backend_logged"] and torch is not None:
        _state["backend_logged"] = True
        _log(event="backend", name=str(torch.cuda.get_allocator_backend()))
    key = "::".join(nodeid.split("::")[1:])
    _state["results"][key] = ("passed", "")
    _state["started"] = time.monotonic()
    _log(event="start", id=key)
    bound = float(os.environ.get("STOWAGE_TORCH_TESTS_BOUND_S", "0"))
    if bound > 0:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, bound)
        faulthandler.dump_traceback_later(bound + HARD_STOP_GRACE_S, exit=True, file=_stacks_file())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    key = "::".join(report.nodeid.split("::")[1:])
    outcome, message = _state["results"].get(key, ("passed", ""))
    lines = (report.longreprtext or "").strip().splitlines()
    raised = [line[1:].strip() for line in lines if line.startswith("E ")]
    text = raised[0] if raised else (lines[-1] if lines else "")
    if hasattr(report, "wasxfail"):
        new = "xfailed" if report.skipped else "xpassed"
    elif report.failed:
        new = "failed" if report.when == "call" else "error"
    elif report.skipped:
        new = "skipped"
    else:
        return
    severity = ("passed", "skipped", "xfailed", "xpassed", "failed", "error")
    if severity.index(new) > severity.index(outcome):
        _state["results"][key] = (new, text)


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if float(os.environ.get("STOWAGE_TORCH_TESTS_BOUND_S", "0")) > 0:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
    key = "::".join(nodeid.split("::")[1:])
    outcome, message = _state["results"].get(key, ("passed", ""))
    _log(event="done", id=key, outcome=outcome, seconds=round(time.monotonic() - _state["started"], 3),
         message=message[:300])
