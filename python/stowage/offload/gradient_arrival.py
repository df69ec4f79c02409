"""When a gradient is final, for the offloaded optimizer (Note [Offloaded optimizer semantics]):
per-parameter hooks, DDP's communication hook, and the end of backward.

``register_post_accumulate_grad_hook`` fires before DDP has reduced the gradient (ranks would
update from different gradients and drift apart), so under DDP the gradients are taken from the
reduced bucket in the communication hook's future instead. DDP copies its buckets into ``.grad``
in a final callback of its own, queued when its last bucket is ready, after the first hook of
ours; so ours queues itself once more from its own callback (the engine runs callbacks queued
while it runs them) and runs after DDP's.

torch 2.11 has no public call for either thing the end of backward needs, so the private ones
torch's own code uses are used here, and only here: the running graph task's id
(torch._C._current_graph_task_id, as register_multi_grad_hook and torch.utils.checkpoint read it)
and a callback queued for the end of backward (Variable._execution_engine.queue_callback, as FSDP2
queues its own). Likewise stowage.offload.adam reads a parameter's post-accumulate hooks where
torch keeps them, in order (Tensor._post_accumulate_grad_hooks): no public call lists them.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist


def weak_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` (a bound method) called through a weak reference to its object: a hook that
    holds it keeps nothing alive, and does nothing (returns None) once the object is gone. Hooks
    registered on a model's parameters live as long as the model; the optimizer must not."""
    ref = weakref.WeakMethod(method)  # type: ignore[arg-type]

    def call(*args: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args)
    return call


class BackwardEnd:
    """Calls `on_end` once at the end of each backward during which arm() was called, after the
    final callbacks already queued (DDP's included); calls `on_abandoned` when a backward that
    armed it never reached its end (it raised) and another begins.
    Contract: arm() from the backward thread; disarm() between backwards."""

    def __init__(self, on_end: Callable[[], None], on_abandoned: Callable[[], None]) -> None:
        self._on_end = on_end
        self._on_abandoned = on_abandoned
        self._armed_task: int | None = None  # the graph task armed for, while it runs

    def arm(self) -> None:
        task = int(torch._C._current_graph_task_id())
        if self._armed_task is not None:
            if self._armed_task == task:
                return
            self._armed_task = None  # the backward armed for raised before its end: this is a new one
            self._on_abandoned()
        engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
        try:
            engine.queue_callback(self._requeue)
        except RuntimeError:
            return  # not inside a backward (a gradient set by hand): step() records versions
        self._armed_task = task

    def disarm(self) -> None:
        """The step took what this backward gave (step() ran): nothing is pending."""
        self._armed_task = None

    def _requeue(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._end)  # type: ignore[attr-defined]

    def _end(self) -> None:
        self._armed_task = None
        self._on_end()


def make_ddp_comm_hook(arrive: Callable[[torch.Tensor, torch.Tensor], None],
                       backward_end: BackwardEnd, process_group: Any) -> Callable[[Any, Any], Any]:
    """A DDP communication hook that averages the bucket like DDP's default (all-reduce, divide
    by the world size) and, once the reduction is done, hands each parameter's reduced gradient
    to `arrive(param, gradient)`."""
    def hook(state: Any, bucket: Any) -> Any:
        backward_end.arm()
        buffer = bucket.buffer()
        buffer.div_(process_group.size() if process_group is not None else dist.get_world_size())
        params = list(bucket.parameters())
        grads = list(bucket.gradients())  # views of the buffer: reduced in place
        future = dist.all_reduce(buffer, group=process_group, async_op=True).get_future()

        def reduced(done: Any) -> torch.Tensor:
            value = done.value()[0]
            for param, grad in zip(params, grads):
                arrive(param, grad)
            return value

        return future.then(reduced)

    # DDP checks a hook's annotations as objects (this module's are strings).
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
    return hook
