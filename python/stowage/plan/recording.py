"""``stowage.plan.profile``: runs one training step and records its lifetime trace.

A dispatch mode (below autograd, where selective checkpointing's policy also sees ops) times each
op, reads the allocator's peak during it, and follows storages from op to op; saved-tensor hooks
see what autograd saves and when backward takes it back; the step context's module calls give
each op and save its module path. The step runs as it would without stowage.plan: nothing is
changed, so it must fit (or be recorded at sizes that do, stowage.plan.sizes).

Functions import torch (and recompute_modes, which imports it) where they run: the package loads
without torch (``stowage plan``, the command, reads and solves traces).
"""

from __future__ import annotations

import contextlib
import gc
import time
import traceback
from typing import Any, Callable, Iterator, Mapping, Sequence

from stowage import _core, memory
from stowage.plan.calibration import measure_cost
from stowage.plan.module_frames import Frame, ModuleFrames
from stowage.plan.sizes import SizedTrace, StepsDiffer, grid_points
from stowage.serving import torch_module
from stowage.step_context import SavedTensorRegion, block_modules, in_backward

PHASES = _core.TracePhase.__members__  # "forward", "backward", "optimizer"


class _DeviceMeter:
    """The allocator's bytes in use, and their peak since the last reset, on the step's device."""

    def __init__(self, device: str) -> None:
        import torch  # (see the module's note: the package loads without torch)

        self._cuda = device == "cuda"
        if memory.is_enabled() or not self._cuda:
            self._reset = lambda: memory.reset_peak_stats(device)
            self._stats = lambda: memory.memory_stats(device)
        else:
            self._reset = torch.cuda.reset_peak_memory_stats
            self._stats = torch.cuda.memory_stats

    def reset(self) -> None:
        self._reset()

    def now_and_peak(self) -> tuple[int, int]:
        stats = self._stats()
        return int(stats["allocated_bytes.all.current"]), int(stats["allocated_bytes.all.peak"])

    def synchronize(self) -> None:
        if self._cuda:
            import torch  # (see the module's note: the package loads without torch)

            torch.cuda.synchronize()

    def release_cache(self) -> None:
        """Returns the allocator's free cached memory to the device."""
        import torch  # (see the module's note: the package loads without torch)

        if memory.is_enabled():
            memory.empty_cache()
        elif self._cuda:
            torch.cuda.empty_cache()


def _storage_key(tensor: Any) -> int:
    """The storage's address (its key); 0 for tensors without storage (sparse, fakes). Every op's
    inputs and outputs go through here, so it reads the address only."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


def _storage_key_and_bytes(tensor: Any) -> tuple[int, int]:
    """The storage's address (its key) and size; (0, 0) for tensors without storage (sparse, fakes)."""
    try:
        storage = tensor.untyped_storage()
        return int(storage.data_ptr()), int(storage.nbytes())
    except (RuntimeError, NotImplementedError):
        return 0, 0


# Ops a replay does not reproduce: cuDNN's and MIOpen's fused RNNs keep state of their own for
# backward (the reserve) and draw their dropout from a random state of their own, not torch's
# generator, which is all a replay puts back. A block that runs one is not recomputed (on an
# H200, replaying cuDNN's LSTM left backward a reserve of 0 elements where it needs 58,368:
# bench/results/2026-11-26-h200-gpu.md); its saved tensors can still be offloaded.
NOT_REPLAYABLE = ("aten::_cudnn_rnn", "aten::miopen_rnn", "aten::_cudnn_init_dropout_state")


class StepRecorder:
    """Records one step; ``trace(cost)`` builds its lifetime trace. One step, one thread. Which op
    made, used and saved which storage, and where each save happened, is kept by the planner's
    StepLedger (Note [Keeping the ledger] in planner/step_ledger.hpp), by storage address; the
    planner builds the trace from it (Note [Building a trace] in planner/trace_builder.hpp)."""

    def __init__(self, device: str, model: Any = None) -> None:
        self.meter = _DeviceMeter(device)
        self.ops: list[Any] = []  # _core.TraceOp
        self.frames = ModuleFrames(self._entered, self._left, self._found_root, root=model)
        self.blocks: set[int] = set()
        self.ledger = _core.StepLedger()
        self.regions: list[Any] = []  # _core.RecordedRegion
        self.active_region = -1
        self.seen_backward = False
        self.loose_saves = 0
        self.start_bytes = 0
        self.without_gradients: list[Any] = []  # the model's parameters that had no gradient as the step began

    # Module frames ------------------------------------------------------------------------
    def _found_root(self, root: Any) -> None:  # (entering the model's forward: before any backward)
        self.blocks |= block_modules(root)
        self.without_gradients += [p for p in root.parameters() if p.grad is None]
        for tensor in list(root.parameters()) + list(root.buffers()):
            self.ledger.add_fixed(_storage_key(tensor))

    def _entered(self, frame: Frame, args: tuple[Any, ...]) -> None:
        import torch  # (see the module's note: the package loads without torch)

        if self.active_region >= 0 or id(frame.module) not in self.blocks:
            return
        self.active_region = self.ledger.enter_region(
            [_storage_key(a) for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor)])
        frame.data["region"] = self.active_region
        self.regions.append(_core.RecordedRegion(frame.path, frame.call))

    def _left(self, frame: Frame) -> None:
        if frame.data.get("region", -1) == self.active_region:
            self.active_region = -1

    # Ops ----------------------------------------------------------------------------------
    def phase(self) -> str:
        if in_backward():
            self.seen_backward = True
            return "backward"
        return "optimizer" if self.seen_backward else "forward"

    def run_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import torch  # (see the module's note: the package loads without torch)

        phase = self.phase()
        self.meter.synchronize()
        self.meter.reset()
        start = time.perf_counter()
        out = func(*args, **kwargs)
        self.meter.synchronize()
        duration_ms = (time.perf_counter() - start) * 1e3
        top = self.frames.top
        module = (top.path if top is not None else "(outside modules)") if phase == "forward" else phase
        region = self.active_region if phase == "forward" else -1
        if region >= 0:
            self._note_input_writes(func, args, kwargs)
            if getattr(getattr(func, "_schema", None), "name", "") in NOT_REPLAYABLE:
                self.regions[region].checkpointable = False
        in_use = self.meter.now_and_peak()[1] - self.start_bytes  # below 0 where the step freed what it began with
        leaves = torch.utils._pytree.tree_leaves
        inputs = [t for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in leaves(out) if isinstance(t, torch.Tensor)]
        io_bytes = sum(t.numel() * t.element_size() for t in inputs + outputs)
        self.ops.append(_core.TraceOp(str(func), module, PHASES[phase], duration_ms, 0, region, in_use, io_bytes))
        schema = getattr(func, "_schema", None)
        is_view = schema is not None and any(r.alias_info is not None for r in schema.returns)
        self.ledger.op_ran(PHASES[phase], [_storage_key(t) for t in inputs],
                           [] if is_view else [_storage_key(t) for t in outputs])
        return out

    def lifted(self, tensor: Any) -> None:
        """`tensor` was made outside the dispatcher and lifted into the step (torch.tensor of a
        Python constant, an index given as a list): no op of the step's made its storage, so the
        ledger forgets what lived at its address (Note [Keeping the ledger])."""
        self.ledger.made_outside_ops(PHASES[self.phase()], [_storage_key(tensor)])

    def _note_input_writes(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A block that writes its own input in place cannot be recomputed: the checkpoint would
        hold the input as it was before the write and replay from it as it is after."""
        from stowage.plan.recompute_modes import written_tensors

        if self.ledger.writes_input(self.active_region, [_storage_key(t) for t in written_tensors(func, args, kwargs)]):
            self.regions[self.active_region].checkpointable = False

    # Saved tensors ------------------------------------------------------------------------
    def pack(self, tensor: Any) -> Any:
        keep = torch_module().TensorOffloader.keep  # detached, its version checked at unpack as torch does
        if in_backward():
            return keep(tensor)
        top = self.frames.top
        key, nbytes = _storage_key_and_bytes(tensor)
        site = ("", -1, self.loose_saves) if top is None else (top.path, top.call, top.saves)
        storage = self.ledger.save(key, nbytes, self.active_region, site)
        if top is not None:
            top.saves += 1
        elif storage is not None:
            self.loose_saves += 1
        if storage is None:  # a parameter's or buffer's, or no storage: no decision reaches it
            return keep(tensor)
        return (storage, keep(tensor))  # see _kept in plan/applying.py: no cycle through autograd

    def unpack(self, packed: Any) -> Any:
        unpack = torch_module().TensorOffloader.unpack
        if not isinstance(packed, tuple):
            return unpack(packed)
        storage, tensor = packed
        self.ledger.taken_back(storage)
        return unpack(tensor)

    # The step ---------------------------------------------------------------------------
    def record(self, step: Callable[[], Any]) -> Any:
        import torch  # (see the module's note: the package loads without torch)
        from torch.utils._python_dispatch import TorchDispatchMode

        from stowage.plan.recompute_modes import LIFTING_OPS, UNMATCHED_OPS

        recorder = self

        class Recording(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                                   kwargs: dict[str, Any] | None = None) -> Any:
                kwargs = kwargs or {}
                if func in UNMATCHED_OPS:
                    out = func(*args, **kwargs)
                    if func in LIFTING_OPS:
                        recorder.lifted(out)
                    return out
                return recorder.run_op(func, args, kwargs)

        # Garbage from before the step collected first: freed during it, it would move the memory
        # of the ops around the collection.
        gc.collect()
        self.meter.synchronize()
        self.start_bytes = self.meter.now_and_peak()[0]
        self.frames.install()
        try:
            with SavedTensorRegion(self.pack, self.unpack), Recording():
                return step()
        finally:
            self.frames.remove()

    def trace(self, cost: Mapping[str, float]) -> Any:
        """The recorded step's lifetime trace (a stowage._core.LifetimeTrace) under `cost`."""
        trace = self.ledger.trace(self.ops, self.regions)
        trace.cost = _core.CostModel(**cost)
        return trace


# Note [A failed recording leaves no trace]
# fit records a step that may not fit (the example whole), then, when it did not, the same step
# at smaller sizes. The second recording must see the room the first had. A failed step leaves
# two things behind: its tensors, alive in the locals of the frames its error's traceback holds
# (activations, the autograd graph and everything saved in it) for as long as anyone holds the
# error; and the allocator's cache, cut into blocks of the failed step's sizes, which a step of
# other sizes cannot use whole (EfficientNet-B0 recorded at 3 rows of 128 x 128 after its 16 rows
# ran out of a 112 MiB device: out of memory at 105 MiB allocated, 6.8 MiB cached in blocks of at
# most 1.6 MiB; with the cache returned first, the same recording peaks at 106 MiB and fits). So
# a failed step's error is stripped of its frames' locals, garbage is collected and the cache is
# returned to the device before the error goes on.


def _let_go(error: BaseException) -> None:
    """Clears the locals of the finished frames `error` and the errors chained to it hold: a
    failed step's tensors (its activations, its autograd graph and the tensors saved in it) live in
    those frames for as long as the error does. Tracebacks still name every file and line."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)  # (frames still running are left as they are)
        pending += [current.__cause__, current.__context__]


def _clean_up(error: BaseException, meter: _DeviceMeter, without_gradients: list[Any]) -> None:
    _let_go(error)
    for parameter in without_gradients:
        parameter.grad = None  # made by the failed step's backward
    gc.collect()
    meter.release_cache()


@contextlib.contextmanager
def _failing_cleanly(meter: _DeviceMeter, without_gradients: list[Any]) -> Iterator[None]:
    """Runs a step that may fail; when it does, the device is left as the step found it before
    the error goes on (Note [A failed recording leaves no trace]; `without_gradients`: the
    parameters that had no gradient before it). An out-of-memory error says how to record the
    step at sizes that fit."""
    import torch  # (see the module's note: the package loads without torch)

    try:
        yield
    except torch.OutOfMemoryError as error:
        _clean_up(error, meter, without_gradients)
        raise torch.OutOfMemoryError(
            f"{error}\nstowage.plan.profile: the step does not fit as it is, so it cannot be recorded as it is. "
            "Record it at sizes that fit and plan for the size you train at: "
            "stowage.plan.profile(step, sizes={'batch': (2, 4), 'seq': (128, 256, 384)}) runs "
            "step(batch=..., seq=...) at each point, and stowage.plan.solve(trace, budget, "
            "at={'batch': 8, 'seq': 4096}) plans for the size you give.") from None
    except BaseException as error:
        _clean_up(error, meter, without_gradients)
        raise


def _record_one(step: Callable[[], Any], device: str, model: Any) -> StepRecorder:
    recorder = StepRecorder(device, model)
    with _failing_cleanly(recorder.meter, recorder.without_gradients):  # (filled as the model is found)
        recorder.record(step)
    return recorder


def profile(step_fn: Callable[..., Any], *, sizes: Mapping[str, Sequence[int]] | None = None,
            device: str | None = None, cost: dict[str, float] | None = None, model: Any = None) -> Any:
    """Runs ``step_fn`` (one training step: forward and backward, and the optimizer step if it
    has one) once and records its lifetime trace (a LifetimeTrace).

    ``sizes``: record the step at a grid of sizes instead, e.g. ``{"batch": (1, 2), "seq":
    (128, 256, 384)}``: ``step_fn(batch=2, seq=128)`` runs at each point of the grid, after one
    unrecorded run at the largest (so every point starts from the state a step leaves), and the
    result is a SizedTrace (stowage.plan.sizes; README, "Planning keep / offload / recompute").
    ``device``: "cuda" or "cpu" (default: cuda when stowage or torch serves CUDA memory, else CPU
    mode). ``cost``: the cost model's figures (``to_host_bytes_per_ms``,
    ``to_device_bytes_per_ms``, ``prefetch_depth``); measured when not given. A step that fails
    leaves the device as it found it (Note [A failed recording leaves no trace]).
    ``model``: the model the step trains, needed when the step calls something other than its
    forward (a loss method calling its blocks): module paths and blocks are then the model's (set
    the plan's ``model`` too). Without it the first module whose forward runs is taken for it."""
    import torch  # (see the module's note: the package loads without torch)

    if device is None:
        device = "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"
    measured = dict(cost) if cost is not None else None
    if sizes is None:
        recorder = _record_one(step_fn, device, model)
        return recorder.trace(measured if measured is not None else measure_cost(device))
    return _profile_grid(step_fn, sizes, device, model, measured)


def _profile_grid(step_fn: Callable[..., Any], sizes: Mapping[str, Sequence[int]], device: str, model: Any,
                  measured: dict[str, float] | None) -> Any:
    """The SizedTrace of `step_fn` at the grid of `sizes`: run once at the largest point first,
    then recorded at each; recorded once more when the points' steps differ."""
    points = grid_points(sizes)
    without_gradients = [p for p in model.parameters() if p.grad is None] if model is not None else []
    with _failing_cleanly(_DeviceMeter(device), without_gradients):  # unrecorded: every recorded point starts
        step_fn(**points[-1])  # from the state a step leaves, a cache grown to the grid's largest sizes included
    grid = {name: [int(v) for v in values] for name, values in sizes.items()}
    recorders = [_record_one(lambda: step_fn(**point), device, model) for point in points]
    measured = measured if measured is not None else measure_cost(device)
    try:
        return SizedTrace(grid, [recorder.trace(measured) for recorder in recorders])
    except StepsDiffer:
        pass
    # Once more, every size now run before: what a first run at a size makes (a cache kept per
    # size) is made by now, and a step whose differences were only that agrees with itself.
    recorders = [_record_one(lambda: step_fn(**point), device, model) for point in points]
    try:
        return SizedTrace(grid, [recorder.trace(measured) for recorder in recorders])
    except StepsDiffer as error:
        raise StepsDiffer(f"{error}\n(Recorded twice, the second time after a run at every size, so that "
                          "nothing a first run at a size makes, a cache kept per size, is the difference.)") from None
