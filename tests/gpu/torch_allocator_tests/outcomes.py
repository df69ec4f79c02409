"""Per-test outcomes of PyTorch's allocator tests, read from and written as JUnit XML, and their
comparison between torch's allocator and stowage (run.py runs the tests; this module judges).

A test is named `Class::test_name` (the class without its module, the name after torch's
parametrisation). Outcomes: passed, failed, error, skipped, xfailed, xpassed, and three that
run.py gives a test pytest could not report: crashed (the process died in it), timeout (over the
per-test bound) and not-run (no time was left). Only `passed` and `xfailed` count as passing.

The verdict on a test that passes under torch's allocator and not under stowage is a regression
unless the test is in native_only.txt (at most MAX_NATIVE_ONLY tests, each with its reason): those
assert the native allocator's own segment sizes, rounding or knobs, which stowage does not share.
A test with a result in one run and none in the other is reported as absent there, and counts as
not passing there.

Stdlib only: the GPU machine has torch and pytest and no package registry.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

MAX_NATIVE_ONLY = 10
PASSING = ("passed", "xfailed")
# run.py's own outcomes, kept in the error element's type when it writes them as JUnit XML
RUNNER_OUTCOMES = ("crashed", "timeout", "not-run")
ABSENT = "absent"
# The worse outcome wins when a test has several results (its call and its teardown, say).
_SEVERITY = ("not-run", "skipped", "xfailed", "passed", "xpassed", "failed", "error", "timeout", "crashed")


@dataclass(frozen=True)
class Outcome:
    outcome: str
    seconds: float = 0.0
    message: str = ""  # the first line of the failure, error or skip


def test_id(classname: str, name: str) -> str:
    """`Class::test` from JUnit's classname (`path.module.Class`) and name."""
    return f"{classname.rsplit('.', 1)[-1]}::{name}"


def _outcome_of(case: ElementTree.Element) -> Outcome:
    seconds = float(case.get("time") or 0.0)
    for tag in ("error", "failure", "skipped"):
        found = case.find(tag)
        if found is None:
            continue
        message = (found.get("message") or found.text or "").strip().splitlines()
        first = message[0] if message else ""
        kind = found.get("type") or ""
        if "OverTimeBound" in first or "OverTimeBound" in kind:  # (runner_plugin's interruption)
            return Outcome("timeout", seconds, first)
        if tag == "error":
            return Outcome(kind if kind in RUNNER_OUTCOMES else "error", seconds, first)
        if tag == "failure":
            return Outcome("failed", seconds, first)
        if kind in RUNNER_OUTCOMES:
            return Outcome(kind, seconds, first)
        return Outcome("xfailed" if kind == "pytest.xfail" else "skipped", seconds, first)
    return Outcome("passed", seconds)


def worse(a: Outcome, b: Outcome) -> Outcome:
    return a if _SEVERITY.index(a.outcome) >= _SEVERITY.index(b.outcome) else b


def read_junit(path: Path) -> dict[str, Outcome]:
    """Each test's outcome in one JUnit XML file (pytest's --junitxml or write_junit's)."""
    found: dict[str, Outcome] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        key = test_id(case.get("classname") or "", case.get("name") or "")
        outcome = _outcome_of(case)
        found[key] = worse(found[key], outcome) if key in found else outcome
    return found


def write_junit(outcomes: dict[str, Outcome], path: Path, suite: str) -> None:
    """Outcomes as JUnit XML that read_junit reads back the same (run.py writes those of a pass
    whose process died before pytest could write its own)."""
    root = ElementTree.Element("testsuites")
    tests = ElementTree.SubElement(root, "testsuite", name=suite, tests=str(len(outcomes)))
    for key, result in sorted(outcomes.items()):
        classname, name = key.split("::", 1)
        case = ElementTree.SubElement(tests, "testcase", classname=classname, name=name,
                                      time=f"{result.seconds:.3f}")
        if result.outcome == "failed":
            ElementTree.SubElement(case, "failure", message=result.message)
        elif result.outcome in ("error", "crashed", "timeout"):
            ElementTree.SubElement(case, "error", message=result.message, type=result.outcome)
        elif result.outcome in ("skipped", "xfailed", "not-run"):
            kind = {"xfailed": "pytest.xfail", "not-run": "not-run"}.get(result.outcome, "pytest.skip")
            ElementTree.SubElement(case, "skipped", message=result.message, type=kind)
    ElementTree.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def read_listing(path: Path) -> list[str]:
    """The lines of a listing (selection.txt), less comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def read_native_only(path: Path) -> dict[str, str]:
    """native_only.txt: `Class::test | reason` a line. Refuses more than MAX_NATIVE_ONLY entries,
    an entry without a reason, and one listed twice."""
    found: dict[str, str] = {}
    for line in read_listing(path):
        key, _, reason = (part.strip() for part in line.partition("|"))
        if not reason:
            raise ValueError(f"{path}: {key!r} has no reason (write `Class::test | why it is native-only`)")
        if key in found:
            raise ValueError(f"{path}: {key!r} is listed twice")
        found[key] = reason
    if len(found) > MAX_NATIVE_ONLY:
        raise ValueError(f"{path}: {len(found)} native-only tests, more than {MAX_NATIVE_ONLY}")
    return found


@dataclass(frozen=True)
class Row:
    test: str
    torch: str  # outcome, or ABSENT
    stowage: str
    verdict: str
    message: str = ""  # stowage's, where it did not pass


@dataclass
class Comparison:
    rows: list[Row] = field(default_factory=list)

    def of(self, verdict: str) -> list[Row]:
        return [row for row in self.rows if row.verdict == verdict]

    @property
    def regressions(self) -> list[Row]:
        return self.of("regression")


def _verdict(torch: str, stowage: str, native_only: bool) -> str:
    torch_passes, stowage_passes = torch in PASSING, stowage in PASSING
    if torch_passes and not stowage_passes:
        return "native-only" if native_only else "regression"
    if stowage_passes and not torch_passes and torch != ABSENT:
        return "passes under stowage only"
    if native_only and torch_passes and stowage_passes:
        return "native-only, passes"
    if torch == ABSENT or stowage == ABSENT:
        return "absent from a run"
    return "same" if torch == stowage else "differs"


def compare(torch: dict[str, Outcome], stowage: dict[str, Outcome], native_only: dict[str, str]) -> Comparison:
    """Every test with a result in either run, test by test (sorted: regressions first)."""
    rows = []
    for key in sorted(set(torch) | set(stowage)):
        t = torch[key].outcome if key in torch else ABSENT
        s = stowage[key].outcome if key in stowage else ABSENT
        message = stowage[key].message if key in stowage and s not in PASSING else ""
        rows.append(Row(key, t, s, _verdict(t, s, key in native_only), message))
    order = ("regression", "absent from a run", "native-only", "passes under stowage only", "differs",
             "native-only, passes", "same")
    rows.sort(key=lambda row: (order.index(row.verdict), row.test))
    return Comparison(rows)


def _counts(outcomes: dict[str, Outcome]) -> str:
    tally: dict[str, int] = {}
    for result in outcomes.values():
        tally[result.outcome] = tally.get(result.outcome, 0) + 1
    return ", ".join(f"{n} {name}" for name, n in sorted(tally.items(), key=lambda item: -item[1])) or "no results"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:160]


def markdown(comparison: Comparison, torch: dict[str, Outcome], stowage: dict[str, Outcome],
             native_only: dict[str, str], header: list[str]) -> str:
    """The comparison as a markdown page: the header lines, each run's tally, the verdicts and the
    table (every test, regressions first), then the native-only list with its reasons."""
    lines = ["# PyTorch's allocator tests under stowage", ""] + [f"- {line}" for line in header]
    lines += [f"- torch's allocator: {_counts(torch)}", f"- stowage: {_counts(stowage)}"]
    for verdict in ("regression", "absent from a run", "native-only", "passes under stowage only", "differs"):
        rows = comparison.of(verdict)
        if rows:
            lines.append(f"- {verdict}: {len(rows)} ({', '.join(row.test for row in rows)})")
    lines += ["", "| test | torch's allocator | stowage | verdict | stowage's message |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {row.test} | {row.torch} | {row.stowage} | {row.verdict} | {_cell(row.message)} |"
              for row in comparison.rows]
    lines += ["", "Native-only (native_only.txt): not passing under stowage is expected of these.", ""]
    lines += [f"- {key}: {reason}" for key, reason in native_only.items()]
    return "\n".join(lines) + "\n"
