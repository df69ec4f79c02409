"""A device's trace cut into training steps, fit's own trial steps set apart, and what grew from
one step to the next.

Steps end at stowage's step marks ("snapshot" events whose user_metadata is "stowage.mark_step",
written by stowage.mark_step()); a trace without marks (stock torch's) is cut where its
allocations repeat: the shortest period P of at least 8 allocations over which the allocation
sizes repeat (at least 90% of the pairs i, i + P equal) and the live bytes where its repetitions
start stay alike or grow as a leaking step's do, each step starting where the trace's most
frequent size first falls in the period. The cutting is C++ (snapshot/trace_steps.hpp), and so
is judging growth (snapshot/live_groups.hpp); this module names the marks and the steps judged. stowage.fit's own steps (its recording
of the step, its rate probes and its trial step) lie between "stowage.fit.trial_begin" and
"stowage.fit.trial_end" marks: they are no part of the run, so the run's headline peak and its
steps leave them out and report them apart.

Positions are those of LivePairs (the trace's alloc and free_completed events, in order); live
bytes at a position count the trace's own allocations and what was live before it began.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stowage import _core
from stowage.snapshot_reader.columns import TraceColumns

MARK_STEP = "stowage.mark_step"
TRIAL_BEGIN = "stowage.fit.trial_begin"
TRIAL_END = "stowage.fit.trial_end"
MIN_GROWING_STEPS = 3  # steps a site must grow over to be called growing
GROWTH_WINDOW = 8  # the last steps of the run judged for growth


@dataclass
class Step:
    number: int
    first_event: int     # the trace's event index where the step begins
    last_event: int      # ... and ends (its mark, or the event before the next step)
    peak_bytes: int      # live bytes at the step's highest
    peak_event: int
    end_bytes: int       # live bytes when it ends
    fit_trial: bool      # stowage.fit's own step, not the run's


def _marked(columns: TraceColumns, value: str) -> np.ndarray:
    return np.array(sorted(index for index, metadata in columns.user_metadata.items() if metadata == value),
                    dtype=np.int64)


def in_trial(columns: TraceColumns, index: np.ndarray) -> np.ndarray:
    """For each event index, whether it lies in one of stowage.fit's trial spans."""
    return _core.in_trial(_marked(columns, TRIAL_BEGIN), _marked(columns, TRIAL_END), len(columns), index)


def cut(columns: TraceColumns, index: np.ndarray, live: np.ndarray, is_alloc: np.ndarray,
        size: np.ndarray) -> tuple[list[Step], str]:
    """The trace's steps (positions `index`, live bytes after each `live`) and how they were found
    ("marks", "repeating allocations", or "" where the trace shows no steps): pieces ending at a
    step's end, and fit's trial spans; what lies between fit's trial spans and before a trial
    (fit choosing, the run setting up) goes with the next step of the run (snapshot/trace_steps.hpp)."""
    rows, found = _core.cut_steps(_marked(columns, MARK_STEP), _marked(columns, TRIAL_BEGIN),
                                  _marked(columns, TRIAL_END), len(columns), index, live, is_alloc,
                                  np.asarray(size, dtype=np.int64))
    return [Step(*row) for row in rows], found


def growing(steps: list[Step], pairs: Any, sites: Any, found_by: str = "marks") -> list[dict[str, Any]]:
    """Sites whose live bytes at the run's step ends grew at every one of its last GROWTH_WINDOW
    (at least MIN_GROWING_STEPS steps, the first left out: it makes the optimizer's states),
    with the bytes they added a step (C++: snapshot/live_groups.hpp), over the trace's LivePairs
    `pairs` and its sites (the inspector's TraceSites). Steps found by repetition end with what
    follows the last whole one: no step to judge."""
    whole = steps[:-1] if found_by == "repeating allocations" else steps
    run = [s for s in whole if not s.fit_trial][1:][-GROWTH_WINDOW:]
    if len(run) < MIN_GROWING_STEPS + 1:
        return []
    ends = np.searchsorted(pairs.index, np.array([step.last_event for step in run], dtype=np.int64), side="right") - 1
    return [{"site": sites.names[site], "bytes_per_step": per_step, "steps": count} for site, per_step, count in
            _core.growing_groups(pairs.is_alloc, pairs.end, pairs.size, sites.of, sites.first, ends)]


def as_dicts(steps: list[Step]) -> list[dict[str, Any]]:
    return [asdict(step) for step in steps]
