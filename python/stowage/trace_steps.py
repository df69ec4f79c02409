"""A device's trace cut into training steps, fit's own trial steps set apart, and what grew from
one step to the next.

Steps end at stowage's step marks ("snapshot" events whose user_metadata is "stowage.mark_step",
written by stowage.mark_step()); a trace without marks (stock torch's) is cut where its
allocations repeat: the shortest period P of at least MIN_PERIOD allocations over which the
allocation sizes repeat (at least REPEAT of the pairs i, i + P equal), each step starting where
the trace's most frequent size first falls in the period. stowage.fit's own steps (its recording
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

from stowage.snapshot_reader.columns import TraceColumns

MARK_STEP = "stowage.mark_step"
TRIAL_BEGIN = "stowage.fit.trial_begin"
TRIAL_END = "stowage.fit.trial_end"
MIN_PERIOD = 8
REPEAT = 0.9
MIN_GROWING_STEPS = 3  # steps a site must grow over to be called growing
GROWTH_WINDOW = 8  # the last steps of the run judged for growth
MAX_STEPS = 10_000  # steps reported one by one


@dataclass
class Step:
    number: int
    first_event: int     # the trace's event index where the step begins
    last_event: int      # ... and ends (its mark, or the event before the next step)
    peak_bytes: int      # live bytes at the step's highest
    peak_event: int
    end_bytes: int       # live bytes when it ends
    fit_trial: bool      # stowage.fit's own step, not the run's


def _marked(columns: TraceColumns, value: str) -> list[int]:
    return sorted(index for index, metadata in columns.user_metadata.items() if metadata == value)


def in_trial(columns: TraceColumns, index: np.ndarray) -> np.ndarray:
    """For each event index, whether it lies in one of stowage.fit's trial spans."""
    begins, ends = _marked(columns, TRIAL_BEGIN), _marked(columns, TRIAL_END)
    inside = np.zeros(len(index), dtype=bool)
    for begin in begins:
        end = next((e for e in ends if e > begin), len(columns))
        inside |= (index > begin) & (index < end)
    return inside


MAX_CANDIDATES = 64  # periods tried
SAME_LEVEL = 0.1  # live bytes where steps start, alike within this share
LEAK_ALIKE = 0.25  # ... or growing by amounts alike within this share (a leak, step over step)
LEAK_SHARE = 0.5  # of what a step allocates, at most


def repeating_period(sizes: np.ndarray, live: np.ndarray) -> tuple[int, int] | None:
    """The shortest period (in allocations) over which `sizes` repeat, and where the first
    repetition starts, None where none does. A period must hold over the whole trace from a
    quarter of the way in (the first step, which makes the optimizer's states, left out), and
    the live bytes where its repetitions start must be alike (a training step ends where it
    began; a layer's repetition within a step does not), or grow as a leaking step's do
    (_leaking). Periods tried: where the size a quarter
    in, or the largest size of the next stretch (one a step, as a rule), recurs."""
    n = len(sizes)
    start = n // 4
    tail = sizes[start:]
    half = (n - start) // 2
    anchor = int(np.argmax(tail[:half])) if half else 0  # the largest allocation recurs once a step
    recurs = np.flatnonzero(tail[anchor + MIN_PERIOD:anchor + half + 1] == tail[anchor]) + MIN_PERIOD
    shortest = np.flatnonzero(tail[MIN_PERIOD:half + 1] == tail[0]) + MIN_PERIOD
    candidates = np.unique(np.concatenate([recurs[:MAX_CANDIDATES], shortest[:MAX_CANDIDATES]]))
    for period in candidates.tolist():
        if np.mean(tail[period:] == tail[:-period]) < REPEAT:
            continue
        values, counts = np.unique(sizes[:period], return_counts=True)
        first = int(np.flatnonzero(sizes[:period] == values[np.argmax(counts)])[0])
        levels = live[first + period::period]
        if len(levels) >= 2 and levels.max() - levels.min() <= SAME_LEVEL * max(int(levels.max()), 1):
            return int(period), first
        if _leaking(levels, float(sizes[first:first + period].sum(dtype=np.float64))):
            return int(period), first
    return None


def _leaking(levels: np.ndarray, allocated: float) -> bool:
    """Whether live bytes at a period's starts grow as a leaking step's do: by about the same
    amount each time, a small part of what a period allocates (a layer's repetition in forward
    keeps most of what it makes)."""
    growth = np.diff(levels)  # (Python ints where live bytes pass int64)
    if len(growth) < 2 or growth.min() <= 0:
        return False
    return bool(growth.max() - growth.min() <= LEAK_ALIKE * growth.max() and growth.max() <= LEAK_SHARE * allocated)


def step_ends(columns: TraceColumns, alloc_index: np.ndarray, alloc_sizes: np.ndarray,
              alloc_live: np.ndarray) -> tuple[list[int], str]:
    """The event indexes where steps end, and how they were found ("marks", "repeating
    allocations", or "" where the trace shows no steps)."""
    marks = _marked(columns, MARK_STEP)
    if marks:  # fit's trial spans are steps of their own
        spans = [b - 1 for b in _marked(columns, TRIAL_BEGIN)] + _marked(columns, TRIAL_END)
        return sorted(set(marks) | {index for index in spans if index >= 0}), "marks"
    if len(alloc_sizes) > 2 * MIN_PERIOD:
        found = repeating_period(alloc_sizes[:200_000], alloc_live[:200_000])  # a period shows well within that
        if found is not None:
            period, first = found
            starts = range(first + period, len(alloc_index), period)
            return [int(alloc_index[s]) - 1 for s in starts], "repeating allocations"
    return [], ""


def cut(columns: TraceColumns, index: np.ndarray, live: np.ndarray, is_alloc: np.ndarray,
        size: np.ndarray) -> tuple[list[Step], str]:
    """The trace's steps (positions `index`, live bytes after each `live`): pieces ending at a
    step's end, and fit's trial spans; what lies between fit's trial spans and before a trial
    (fit choosing, the run setting up) goes with the next step of the run."""
    ends, found = step_ends(columns, index[is_alloc], size[is_alloc], live[is_alloc])  # (int64, or Python ints)
    if not found or not len(index):
        return [], found
    trial = in_trial(columns, index)
    marks = set(_marked(columns, MARK_STEP)) if found == "marks" else set(ends)
    bounds = np.searchsorted(index, np.asarray(ends), side="right").tolist()
    # whether a piece ends a step of the run; with marks, what follows the last one is no step
    closes = [end in marks for end in ends] + [found != "marks"]
    pieces = [(a, b, c) for a, b, c in zip([0, *bounds], [*bounds, len(index)], closes) if b > a]
    steps: list[Step] = []
    start = None
    for a, b, ends_step in pieces:
        if trial[a:b].any():
            steps.append(_step(index, live, a, b, True))
            continue
        start = a if start is None else start
        if ends_step:
            steps.append(_step(index, live, start, b, False))
            start = None
        if len(steps) >= MAX_STEPS:
            break
    for number, step in enumerate(steps):
        step.number = number
    return steps, found


def _step(index: np.ndarray, live: np.ndarray, a: int, b: int, fit_trial: bool) -> Step:
    at = a + int(np.argmax(live[a:b]))
    return Step(0, int(index[a]), int(index[b - 1]), int(live[at]), int(index[at]), int(live[b - 1]), fit_trial)


def growing(steps: list[Step], live_by_site_at: Any, found_by: str = "marks") -> list[dict[str, Any]]:
    """Sites whose live bytes at the run's step ends grew at every one of its last GROWTH_WINDOW
    (at least MIN_GROWING_STEPS steps, the first left out: it makes the optimizer's states),
    with the bytes they added a step. `live_by_site_at(event_index)` gives {site: bytes} there.
    Steps found by repetition end with what follows the last whole one: no step to judge."""
    whole = steps[:-1] if found_by == "repeating allocations" else steps
    run = [s for s in whole if not s.fit_trial][1:][-GROWTH_WINDOW:]
    if len(run) < MIN_GROWING_STEPS + 1:
        return []
    at_ends = [live_by_site_at(step.last_event) for step in run]
    found = []
    for site in at_ends[-1]:
        series = [ends.get(site, 0) for ends in at_ends]
        if all(later > earlier for earlier, later in zip(series, series[1:])):
            found.append({"site": site, "bytes_per_step": (series[-1] - series[0]) // (len(series) - 1),
                          "steps": len(series)})
    return sorted(found, key=lambda row: row["bytes_per_step"], reverse=True)


def as_dicts(steps: list[Step]) -> list[dict[str, Any]]:
    return [asdict(step) for step in steps]
