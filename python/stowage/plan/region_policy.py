"""The forward decisions of one checkpointed block call: per op, in the order the lifetime trace recorded
the block's ops, keep (cache) what the plan keeps and recompute the rest (Note [Selective recompute]
in recompute_modes.py replays them). An op that is not the one recorded at its place means the plan
does not match the step: from there on everything is kept (the block then frees nothing more, but
computes the same), and the mismatch is told.

Contract: one per checkpoint call (torch calls ``context_fn`` per call), on the step's thread.
"""

from __future__ import annotations

from typing import Any, Callable


class RegionPolicy:
    def __init__(self, recorded_ops: list[str], kept: set[int], mismatch: Callable[[str], None]) -> None:
        self._recorded, self._kept, self._mismatch = recorded_ops, kept, mismatch
        self._seen = 0
        self._matching = True

    def keep(self, func: Any) -> bool:
        """Whether the forward's next op, `func`, keeps its outputs (else it is recomputed)."""
        index = self._seen
        self._seen += 1
        if self._matching and (index >= len(self._recorded) or str(func) != self._recorded[index]):
            self._matching = False
            recorded = self._recorded[index] if index < len(self._recorded) else "nothing"
            self._mismatch(f"op {index} is {func}, recorded {recorded}")
        return not self._matching or index in self._kept
