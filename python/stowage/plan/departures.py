"""Where the steps a plan is applied to depart from the lifetime trace it was made from, and what the
user hears of it: one warning the first time the steps depart in a given way, not one a step.

A departure is a place the plan cannot match to the trace: a save in a module the trace does
not have there (an added dropout, a kernel chosen by length that saves more), a module the plan
checkpoints that the model no longer has, an op of a recomputed block the trace did not record.
The plan still computes what the step computes: an unknown save is offloaded (the offloader keeps
what it must, and the budget holds), a block it cannot match runs as it is.

Contract: one step at a time, on the thread that trains (the plan's own contract). `this_step`
holds the current (or last) step's departures, each once; `seen` how many steps each has been in.
"""

from __future__ import annotations

SHOWN = 3  # departures named in a warning; the rest are counted


class Departures:
    def __init__(self) -> None:
        self.this_step: list[str] = []
        self.seen: dict[str, int] = {}
        self.steps = 0           # steps the plan ran to their end
        self.departed_steps = 0  # of those, steps with a departure

    def begin_step(self) -> None:
        self.this_step = []

    def note(self, what: str) -> None:
        if what not in self.this_step:
            self.this_step.append(what)

    def end_step(self) -> str | None:
        """Counts a step that ran to its end; the warning to give where it departs in a way no
        earlier step did, else None."""
        self.steps += 1
        if not self.this_step:
            return None
        self.departed_steps += 1
        new = [what for what in self.this_step if what not in self.seen]
        for what in self.this_step:
            self.seen[what] = self.seen.get(what, 0) + 1
        if not new:
            return None
        named = "; ".join(new[:SHOWN]) + (f"; and {len(new) - SHOWN} more" if len(new) > SHOWN else "")
        return (f"stowage.plan: step {self.steps} does not match the lifetime trace the plan was made from ({named}). "
                "What the plan cannot place is offloaded: the numbers are the same and the budget holds, at the "
                "cost of copies the plan did not weigh. Profile the step as it runs now (stowage.plan.profile, or "
                "stowage.fit again) for a plan that places it. Said once for these; plan.departed_steps counts "
                f"the steps that depart ({self.departed_steps} of {self.steps} so far).")
