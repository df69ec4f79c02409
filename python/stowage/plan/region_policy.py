"""The selective-checkpointing policy of one checkpointed block call: per op, in the order the
profile recorded the block's ops, save (MUST_SAVE) what the plan keeps and recompute
(PREFER_RECOMPUTE) the rest. Recomputation replays forward's decisions op by op. An op that is not
the one recorded at its place means the plan does not match the step: from there on everything
is saved (the block then frees nothing more, but computes the same), and the mismatch is told.

Contract: one per checkpoint call (torch calls ``context_fn`` per call), on the step's thread.
"""

from __future__ import annotations

from typing import Any, Callable


class RegionPolicy:
    def __init__(self, recorded_ops: list[str], kept: set[int], mismatch: Callable[[str], None]) -> None:
        self._recorded, self._kept, self._mismatch = recorded_ops, kept, mismatch
        self._forward: list[Any] = []
        self._replayed = 0
        self._matching = True

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        if ctx.is_recompute:
            index = self._replayed
            self._replayed += 1
            return self._forward[index] if index < len(self._forward) else CheckpointPolicy.MUST_SAVE
        index = len(self._forward)
        if self._matching and (index >= len(self._recorded) or str(func) != self._recorded[index]):
            self._matching = False
            recorded = self._recorded[index] if index < len(self._recorded) else "nothing"
            self._mismatch(f"op {index} is {func}, recorded {recorded}")
        recompute = self._matching and index not in self._kept
        decision = CheckpointPolicy.PREFER_RECOMPUTE if recompute else CheckpointPolicy.MUST_SAVE
        self._forward.append(decision)
        return decision
