"""``stowage.fit``: the same device trains a larger model, or longer sequences.

    import stowage, torch
    stowage.enable()                                   # before the first CUDA tensor
    model = build_model().cuda()
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=3e-4), example_batch)
    for batch in data:
        loss = fitted.step(batch)

``fit`` records one training step (whole when it fits; cut to smaller batches and sequences from
the example when it does not, stowage.plan.sizes), weighs every share of AdamW's states kept on the
device against the room it leaves the step's activations (the planner's keep / offload / recompute
under that room), takes the fastest predicted step that fits, and prints its decisions as a table.
States that do not all fit move to host memory (stowage.offload.AdamW with the share chosen as
``device_fraction``). The returned ``Fitted`` runs steps (``fitted.step(batch)``) or wraps a
loop's own forward and backward (``with fitted:``), with ``fitted.optimizer`` in place of the
factory's. Under torch.distributed each rank fits its own step and all take one share: the one
that fits every rank's device, weighed by the slowest rank's predicted step.
"""

from stowage.fitting.fit import check_allocator, fit
from stowage.fitting.fitted import Fitted

__all__ = ["Fitted", "check_allocator", "fit"]
