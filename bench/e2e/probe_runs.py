"""What the bracketing benchmarks share (gpu_headline.py, peers_at_budget.py): a run's time budget,
one point measured in a fresh interpreter that prints its result as a JSON line, the bracket
around a predicted point, and the host memory a process may take. Each point is its own process
because an allocator is chosen once a process and an out-of-memory leaves a process's caches (and
a distributed runtime's state) as they were."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

Point = dict[str, Any]


class Clock:
    """The run's remaining time; probes are refused once less than `floor` seconds remain."""

    def __init__(self, budget_s: float, floor: float = 15.0) -> None:
        self.deadline = time.monotonic() + budget_s
        self.floor = floor

    def left(self) -> float:
        return self.deadline - time.monotonic()


def run_point(command: list[str], clock: Clock, point: Point, limit_s: float | None = None,
              environment: dict[str, str] | None = None) -> Point:
    """Runs `command` (which prints its result as its last line starting with "{") under what is
    left of `clock` (and at most `limit_s`), and returns `point` updated with that result, or with
    fits None (not run, or not finished) or False (failed: its exit status and last line), and the
    seconds it took (wall_s)."""
    timeout = clock.left() - 5
    if limit_s is not None:
        timeout = min(timeout, limit_s)
    if timeout < clock.floor:
        return {**point, "fits": None, "why": "not run: the run's time budget was spent"}
    started = time.monotonic()
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)
    except subprocess.TimeoutExpired:
        return {**point, "fits": None, "why": f"not finished within the {timeout:.0f} s it was given",
                "wall_s": round(time.monotonic() - started, 1)}
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no output"]
        result = {**point, "fits": False, "why": f"exit status {completed.returncode}: {tail[0][:300]}"}
    else:
        result = {**point, **json.loads(lines[-1])}
    result["wall_s"] = round(time.monotonic() - started, 1)
    return result


def bracket(try_point: Callable[[int], Point], predicted: int, step_up: int, lowest: int = 1,
            most_up: int = 4) -> tuple[Point | None, list[Point]]:
    """Tries `predicted`, then points past it (`step_up`, then twice as far each time, at most
    `most_up` of them) until one does not fit, or, where the prediction failed, points below it
    (down to `lowest`) until one fits: (the largest point that fitted, every point tried). A point
    that was not run (fits None) ends the search where it is."""
    points = [try_point(predicted)]
    if points[0]["fits"]:
        best, n, step = points[0], predicted, step_up
        for _ in range(most_up):
            n += step
            points.append(try_point(n))
            if not points[-1]["fits"]:
                break
            best, step = points[-1], 2 * step
        return best, points
    n = predicted
    while points[-1]["fits"] is False and n - step_up >= lowest:
        n -= step_up
        points.append(try_point(n))
    return (points[-1] if points[-1]["fits"] else None), points


def host_available_bytes() -> int:
    """MemAvailable, or the cgroup's limit less its usage where that is lower."""
    available = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        usage = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            available = min(available, int(limit) - usage)
    except (OSError, ValueError):
        pass
    return available


def resident_bytes() -> int:
    """This process's resident host memory (pinned buffers count once touched)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
