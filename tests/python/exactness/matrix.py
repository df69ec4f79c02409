"""Runs the exactness matrix outside pytest and prints it as markdown: features x patterns (on the
pattern model), features x models (on the plain loop), then every cell that is not PASS with its
reason.

    python tests/python/exactness/matrix.py [--full] [--only FEATURE[,FEATURE]] [--model MODEL]
                                            [--device cpu|cuda]

Contract: runs in a process of its own (it enables CPU mode at the suite's capacity, or with
``--device cuda`` makes stowage torch's CUDA allocator before CUDA starts), under the device's
session settings (exactness.devices); the table's cells: PASS, refused (an allowed refusal),
n/a, FAIL (the numbered reason below).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stowage  # noqa: E402
from exactness.cells import CAPACITY, PATTERN_MODEL, Caches, Cell, Config, Outcome, cells, run_cell  # noqa: E402
from exactness.devices import CUBLAS_VARIABLE, CUBLAS_WORKSPACE, session  # noqa: E402
from exactness.features import FEATURES  # noqa: E402


def _shape(reason: str) -> str:
    """A reason with its figures and names of sizes left out: cells failing the same way share one."""
    return re.sub(r"\d[\d.,]*(e[-+]\d+)?( ?[KMG]iB)?", "#", reason)


def _mark(outcome: Outcome, reasons: list[str], shapes: list[str]) -> str:
    if outcome.status == "PASS":
        return "PASS"
    if outcome.status == "N/A":
        return "n/a"
    shape = _shape(outcome.reason)
    if shape not in shapes:
        shapes.append(shape)
        reasons.append(outcome.reason)
    index = shapes.index(shape) + 1
    return f"refused ({index})" if outcome.status == "REFUSED" else f"FAIL ({index})"


def table(rows: list[str], columns: list[str], marks: dict[tuple[str, str], str], corner: str) -> str:
    lines = [f"| {corner} | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(marks.get((row, c), "") for c in columns) + " |")
    return "\n".join(lines)


def _models_loop(cell: Cell) -> bool:
    """Whether the cell is its feature's loop on a model: the plain one, or the feature's own."""
    return cell.pattern == (FEATURES[cell.feature].only_pattern or "plain")


def report(results: dict[Cell, Outcome]) -> str:
    reasons: list[str] = []
    shapes: list[str] = []
    by_pattern: dict[tuple[str, str], str] = {}
    by_model: dict[tuple[str, str], str] = {}
    for cell, outcome in results.items():
        mark = _mark(outcome, reasons, shapes)
        if cell.model == PATTERN_MODEL:
            by_pattern[(cell.feature, cell.pattern)] = mark
        if _models_loop(cell):
            by_model[(cell.feature, cell.model)] = mark
    features = list(dict.fromkeys(c.feature for c in results))
    patterns = list(dict.fromkeys(c.pattern for c in results if c.model == PATTERN_MODEL))
    models = list(dict.fromkeys(c.model for c in results if _models_loop(c)))
    parts = [f"Patterns on `{PATTERN_MODEL}`:", "", table(features, patterns, by_pattern, "feature \\ pattern"), "",
             "Models on the plain loop (a feature with a loop of its own: on that loop):", "", table(features, models, by_model, "feature \\ model"), "",
             "Reasons (one cell's words for each; cells marked alike failed alike, with their own figures):", ""]
    parts += [f"{i}. {reason}" for i, reason in enumerate(reasons, 1)]
    if any(c.model != PATTERN_MODEL and not _models_loop(c) for c in results):
        parts += ["", "Other cells not passing:", ""]
        parts += [f"- `{c.id}`: {o.status} {o.reason}" for c, o in results.items()
                  if c.model != PATTERN_MODEL and not _models_loop(c) and o.status not in ("PASS", "N/A")]
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="every model x pattern x feature, more steps and sizes")
    parser.add_argument("--only", default="", help="comma-separated features to run")
    parser.add_argument("--model", default="", help="only this model's cells")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="CPU mode (default) or a GPU")
    options = parser.parse_args()
    config = Config(full=options.full, device=options.device)
    chosen = [c for c in cells(config) if (not options.only or c.feature in options.only.split(","))
              and (not options.model or c.model == options.model)]
    if options.device == "cuda":
        os.environ.setdefault(CUBLAS_VARIABLE, CUBLAS_WORKSPACE)
        if not stowage.is_enabled():
            stowage.enable(device="cuda")
    else:
        stowage.enable(device="cpu", capacity=CAPACITY)
    started = time.monotonic()
    with session(options.device):  # as the test modules run it
        caches = Caches(config)
        results = {cell: run_cell(cell, caches) for cell in chosen}
    print(report(results))
    counts = {s: sum(o.status == s for o in results.values()) for s in ("PASS", "REFUSED", "N/A", "FAIL")}
    print(f"\n{len(results)} cells in {time.monotonic() - started:.0f} s: " +
          ", ".join(f"{n} {s}" for s, n in counts.items()))
    stowage.mark_step()
    if options.device == "cpu":
        stowage.disable()
    return 0


if __name__ == "__main__":
    sys.exit(main())
