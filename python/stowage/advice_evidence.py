"""What the advice rules (stowage.advice) read of a trace, gathered from its columns: the parts
a rule may not need are worked out only when it asks.

Contract: `of_trace` builds an advice.Evidence over the arrays it is given and keeps them; it
copies nothing and changes nothing. What a rule asks for (the stack flags, every category,
backward's allocations) is worked out once, however many rules ask.
"""

from __future__ import annotations

import functools

import numpy as np

from stowage import categories
from stowage.advice import Evidence
from stowage.snapshot_reader.columns import TraceColumns
from stowage.tag_reading import ExactTags


def of_trace(columns: TraceColumns, pairs: object, site_of: np.ndarray, site_names: list[str], live: np.ndarray,
             peak_position: int, at_peak: tuple[np.ndarray, np.ndarray], step_starts: np.ndarray,
             exact: ExactTags | None) -> Evidence:
    """The Evidence of a trace: its LivePairs `pairs`, each position's site (`site_of`, ids into
    `site_names`), its live-bytes series, the peak's position with the positions live there and
    their categories, where steps begin, and stowage's tags where the snapshot has them."""
    index, is_alloc, end = pairs.index, pairs.is_alloc, pairs.end  # type: ignore[attr-defined]

    @functools.cache
    def flags() -> np.ndarray | None:  # the trace's stack flags, once for every rule
        return categories.trace_flags(columns, index, is_alloc)

    @functools.cache
    def every() -> tuple[np.ndarray, np.ndarray]:
        made = categories.position_flags(columns, index) & categories.OPTIMIZER != 0
        if exact is not None:
            return exact.category, made
        return categories.all_categories(columns, index, is_alloc, end, step_starts, flags()), made

    @functools.cache
    def backward_allocations() -> np.ndarray:
        return categories.backward_allocations(is_alloc, flags())

    def kept_without_backward() -> np.ndarray:
        saved = exact.category == categories.ACTIVATIONS if exact is not None else None
        return categories.kept_without_backward(columns, index, is_alloc, end, flags(), saved)

    def kept_across_steps(site: str) -> np.ndarray:
        """A site's allocations kept into a later step, not for its backward (a step boundary
        found by repetition may cut through a forward, whose activations backward frees in the
        next step)."""
        if site not in site_names:
            return np.zeros(0, dtype=np.int64)
        made = np.flatnonzero(site_of == site_names.index(site))
        later = np.searchsorted(step_starts, end[made], side="right") > np.searchsorted(step_starts, made, side="right")
        made = made[later]
        return made[~categories.freed_in_backward(backward_allocations(), end, step_starts, made)]

    return Evidence(live, pairs, peak_position, at_peak[0], at_peak[1], step_starts, every, kept_without_backward,
                    kept_across_steps, backward_allocations, lambda: categories.loss_allocations(is_alloc, flags()),
                    (exact.module, exact.paths) if exact is not None else None)
