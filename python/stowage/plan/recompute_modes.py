"""Selective recomputation for a plan's checkpointed blocks, computing exactly what the step
computes without it.

Note [Selective recompute]
A checkpointed block's forward runs under ForwardMode: each op runs, and the ones the plan keeps
have their outputs cached (detached, with their versions); backward re-runs the block's forward
under ReplayMode, which hands back each kept op's cached outputs and runs the others again.
torch's own selective checkpointing does the same, with three departures that keep a step exact:
- State outside the block that its forward writes (BatchNorm's running statistics and counter, a
  buffer a forward updates, an input the block adds to in place) is written again when the block
  is recomputed. ForwardMode copies each such tensor before its first write; ReplayMode puts that
  copy in as the replay begins (so the replay reads what the forward read) and the tensor's
  value after the forward back as it ends (so each update happens once, as without the plan),
  each time leaving its version as it was (the swap is invisible to torch's own checks).
- Tensors from outside the block that its forward read (its inputs, parameters, buffers) and that
  were changed in place between the forward and the replay would make the replay compute
  something else: ReplayMode raises torch's "modified by an inplace operation" error instead, as
  torch does for the tensors it saves itself. So it does for a tensor the block made and one of
  its later ops took (one torch would have saved) that is still alive after the block and was
  changed in place before the replay: without the plan, torch would raise at that save; the
  replay would recompute it as it was and say nothing. (A tensor no later op of the block took,
  such as the block's output, is torch's own business after the block.)
- A cached output changed in place after it was cached (a later op, or code after the block,
  writing into it) is not an error: that op is run again instead, on the replay's own inputs.
- Writes that bump no version (``t.data.mul_()``, a ``.detach()`` alias kept by a forward hook,
  ``p.data = ...``) leave nothing for those checks. Without the plan, torch's saved tensors alias
  what the block read and made, so backward would read such a write where torch saved the
  tensor, and the values the forward computed from it as they were; a replay can give only one
  of the two, so it refuses instead (``RecomputeWatch``): it compares the bytes of the tensors
  from outside the block that the forward read (its inputs and buffers; not parameters, whose
  bytes a watch would read twice a step, only whether one was given another storage) and of the
  storages the block made, a later op of it took and that are still alive after it (held until the
  replay, as torch's saved tensors would hold them) with their bytes as the forward ended, and
  raises naming the block and the tensor where they differ.
The cache is read by position, not consumed, so a block can be replayed once per backward
(``retain_graph=True``). A replay that meets a different op than the forward ran at a position
raises, naming both (the block's forward is not deterministic in its ops).

Contract: one ForwardMode / ReplayMode pair per checkpointed call (torch calls ``context_fn`` per
call), on the thread running the step; the pair shares a RecomputeRecord.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.checkpoint import SAC_IGNORED_OPS

from stowage.serving import torch_module

# Ops that are no part of a block's sequence of ops: torch's own (SAC_IGNORED_OPS), and a tensor
# made from a Python constant (aten.lift_fresh), which a module may make once and cache
# (transformers' Llama in its first forward), so its recompute need not run it again.
LIFTING_OPS = frozenset({torch.ops.aten.lift_fresh.default})  # hand over a tensor made outside the dispatcher
UNMATCHED_OPS = frozenset(SAC_IGNORED_OPS) | LIFTING_OPS


def _storage_key(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # no storage (sparse, fakes): never outside state
        return 0


# Batch normalisation's kernels update the running statistics they are given without their schemas
# saying so (native_batch_norm, cudnn_batch_norm, miopen_batch_norm, SyncBatchNorm's
# batch_norm_gather_stats*): an argument of these names is written when the op normalises with
# the batch's statistics, unless the op says it does not update them.
_RUNNING_STATISTICS = ("running_mean", "running_var")
_NOT_UPDATING = ("_backward", "no_update", "no_training", "_functional")


def _argument(schema: Any, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    argument = schema.arguments[index]
    return args[index] if index < len(args) else kwargs.get(argument.name, argument.default_value)


def written_tensors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors `func` writes into: its schema's mutable arguments, and the running statistics
    batch normalisation updates without declaring them."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    names = [a.name for a in schema.arguments]
    updates_statistics = not any(part in schema.name for part in _NOT_UPDATING) and \
        ("training" not in names or bool(_argument(schema, names.index("training"), args, kwargs)))
    written = []
    for index, argument in enumerate(schema.arguments):
        declared = argument.alias_info is not None and argument.alias_info.is_write
        if declared or (updates_statistics and argument.name in _RUNNING_STATISTICS):
            value = _argument(schema, index, args, kwargs)
            written.extend(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))
    return written


def _overwrite(tensor: torch.Tensor, value: torch.Tensor, version: int | None = None) -> None:
    """Copies `value` into `tensor`, its version then `version` (default: as it was before)."""
    version = tensor._version if version is None else version
    with torch.no_grad():
        tensor.copy_(value)
    torch._C._autograd._unsafe_set_version_counter((tensor,), (version,))


@dataclass
class _Cached:
    """One kept op's outputs, detached as torch's selective checkpointing detaches them, each with
    the version counter of the tensor it came from (a detached alias made below autograd does not
    share it: stowage's KeptTensor holds the original's)."""

    outputs: Any
    kept: list[Any]

    @staticmethod
    def of(func: Any, out: Any) -> "_Cached":
        schema = getattr(func, "_schema", None)
        aliases = schema is not None and any(r.alias_info is not None for r in schema.returns)
        keep = torch_module().TensorOffloader.keep
        kept: list[Any] = []

        def detach(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            kept.append(keep(x))
            return kept[-1].tensor if (x.is_floating_point() or x.is_complex() or aliases) else x

        outputs = tree_map(detach, out)
        return _Cached(outputs, kept)

    def intact(self) -> bool:
        return all(k.intact() for k in self.kept)


@dataclass
class RecomputeRecord:
    """What a checkpointed call's forward did, for its replays."""

    ops: list[Any] = field(default_factory=list)
    cached: list[_Cached | None] = field(default_factory=list)
    read: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)  # id -> (tensor, version)
    taken: list[Any] = field(default_factory=list)  # SavedVersion of each made-and-taken tensor alive at the end
    written: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # id -> (tensor, before)
    watch: RecomputeWatch | None = None  # what the forward read and made, as it ended


def _described(tensor: torch.Tensor) -> str:
    return f"[{tensor.type()} {list(tensor.shape)}]"


class RecomputeWatch:
    """The bytes a replay starts from, as the block's forward left them (Note [Selective
    recompute], its last point): ``watched`` (content checksums, by device) and the storage each
    read tensor had (``p.data = ...`` gives a parameter another; FSDP's resizing keeps it)."""

    def __init__(self, watched: list[tuple[torch.Tensor, str]], read: list[torch.Tensor]) -> None:
        """`watched`: (tensor, what it is, for the message); `read`: every tensor from outside the
        block its forward read."""
        self._checksums = torch_module().content_checksums
        self.watched = watched
        self.places = [(t, torch_module().WeakStorage(t)) for t in read]
        self.sums = self._sums()

    def _sums(self) -> dict[Any, tuple[list[int], torch.Tensor]]:
        by_device: dict[Any, list[int]] = {}
        for index, (tensor, _) in enumerate(self.watched):
            by_device.setdefault(tensor.device, []).append(index)
        return {device: (indices, self._checksums([self.watched[i][0] for i in indices]))
                for device, indices in by_device.items()}

    def check(self, where: str) -> None:
        """Raises where a watched tensor's bytes, or a read tensor's storage, changed."""
        for tensor, storage in self.places:
            if not storage.is_storage_of(tensor):
                raise RuntimeError(
                    f"stowage.plan: {where} is recomputed in backward, and {_described(tensor)}, which its forward "
                    "read, was given another storage after it (`.data = ...`): without the plan torch's saved "
                    "tensors would keep the one the forward read; recomputed, the block would read the new one. "
                    "Assign it before forward or after backward.")
        for device, (indices, before) in self.sums.items():
            now = self._checksums([self.watched[i][0] for i in indices])
            changed = (now != before).any(1).tolist()
            if any(changed):
                _, described = self.watched[indices[changed.index(True)]]
                raise RuntimeError(
                    f"stowage.plan: {where} is recomputed in backward, and {described} was "
                    "written after the block's forward through .data or another alias that does not bump its "
                    "version. Without the plan, backward would read the written bytes where torch saved that "
                    "tensor and the values the forward computed from it as they were; recomputed from it, the "
                    "block cannot give both. Write it before forward or after backward (or write a clone), or "
                    "plan this block's tensors kept or offloaded instead of recomputed.")


class ForwardMode(TorchDispatchMode):
    """The block's forward: runs every op, caches what `keep(func)` says to keep, and notes the
    tensors from outside the block that it reads and writes."""

    def __init__(self, record: RecomputeRecord, keep: Callable[[Any], bool]) -> None:
        super().__init__()
        self._record, self._keep = record, keep
        self._made: set[int] = set()  # storages the block's ops made
        self._taken: dict[int, Any] = {}  # weak references to made tensors a later op took
        self._taken_storages: dict[int, tuple[Any, str]] = {}  # their storages (WeakStorage, described), by address

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in UNMATCHED_OPS:
            return func(*args, **kwargs)
        keep = self._keep(func)
        for tensor in tree_leaves((args, kwargs)):
            if not isinstance(tensor, torch.Tensor):
                continue
            if _storage_key(tensor) not in self._made:
                self._record.read.setdefault(id(tensor), (tensor, 0))
            else:
                self._taken.setdefault(id(tensor), weakref.ref(tensor))
                self._note_taken_storage(tensor)
        for tensor in written_tensors(func, args, kwargs):
            if _storage_key(tensor) not in self._made and id(tensor) not in self._record.written:
                self._record.written[id(tensor)] = (tensor, tensor.detach().clone())
        out = func(*args, **kwargs)
        # New storages only: an op writing in place into a tensor from outside (BatchNorm's
        # counter) returns that tensor, which stays outside.
        given = {_storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        made = {_storage_key(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
        self._made.update(key for key in made if key not in given)
        self._made.discard(0)
        self._record.ops.append(func)
        self._record.cached.append(_Cached.of(func, out) if keep else None)
        return out

    def _note_taken_storage(self, tensor: torch.Tensor) -> None:
        key = _storage_key(tensor)
        known = self._taken_storages.get(key)
        if known is None or not known[0].alive():  # (an address freed and reused within the block)
            self._taken_storages[key] = (torch_module().WeakStorage(tensor), _described(tensor))

    def __exit__(self, *exc: Any) -> Any:
        record = self._record
        written = {_storage_key(t) for t, _ in record.written.values()}
        record.read = {key: (t, t._version) for key, (t, _) in record.read.items() if _storage_key(t) not in written}
        alive = [t for t in (ref() for ref in self._taken.values()) if t is not None]
        record.taken = [torch_module().SavedVersion(t) for t in alive]
        result = super().__exit__(*exc)  # first: the watch's checksums are not the block's ops
        if exc[0] is None:
            record.watch = self._watch()
        self._taken, self._taken_storages = {}, {}
        return result

    def _watch(self) -> RecomputeWatch:
        read = [t for t, _ in self._record.read.values() if _storage_key(t)]
        parameters = {_storage_key(t) for t in read if isinstance(t, torch.nn.Parameter)}
        watched = [(t, _described(t) + ", which its forward read,") for t in read if _storage_key(t) not in parameters]
        for weak, described in self._taken_storages.values():
            held = weak.bytes()
            if held is not None:
                watched.append((held, f"the storage of {described}, which its forward made and something still "
                                      "referenced after it,"))
        return RecomputeWatch(watched, read)


_replayed: list[str] = []  # the block recomputed last (autograd may recompute on a thread of its own)


def _failed(where: str, how: str, error: BaseException) -> RuntimeError:
    return RuntimeError(f"stowage.plan: {where} ran {how} when recomputed in backward: its forward reads state "
                        "it changes outside its tensors (a key-value cache? use_cache=False in training); leave "
                        "it out of the plan's recompute. torch: " + str(error).splitlines()[0])


def recompute_failure(error: BaseException | None) -> RuntimeError | None:
    """torch's CheckpointError after a block this process recomputed as that block's failure, named
    as fit's trial reads it (its tensors then kept or offloaded); None for any other error. torch
    raises it when a recomputed tensor's shape or dtype differs from the forward's: the block reads
    state its forward changed outside its tensors (a key-value cache appended to)."""
    if not isinstance(error, torch.utils.checkpoint.CheckpointError) or not _replayed:
        return None
    return _failed(_replayed.pop(), "with other tensor shapes or dtypes", error)


class ReplayMode(TorchDispatchMode):
    """The block's forward again, in backward: cached outputs where kept and intact, every other
    op run; outside state the forward wrote restored at the end (Note [Selective recompute])."""

    def __init__(self, record: RecomputeRecord, where: str) -> None:
        super().__init__()
        self._record, self._where = record, where
        self._position = 0
        self._after: list[tuple[torch.Tensor, torch.Tensor, int]] = []  # (tensor, after forward, version)

    def __enter__(self) -> Any:
        for taken in self._record.taken:
            taken.check()
        for tensor, version in self._record.read.values():
            if tensor._version != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: [{tensor.type()} {list(tensor.shape)}], is at version {tensor._version}; expected "
                    f"version {version} instead. ({self._where} reads it and is recomputed in backward under "
                    "stowage's plan.)")
        if self._record.watch is not None:  # (after torch's own checks: a write that bumped a version is theirs)
            self._record.watch.check(self._where)
        self._after = [(t, t.detach().clone(), t._version) for t, _ in self._record.written.values()]
        for tensor, before in self._record.written.values():
            _overwrite(tensor, before)
        self._position = 0
        _replayed[:] = [self._where]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        result = super().__exit__(*exc)  # first: the restoring copies are not the block's ops
        for tensor, after, version in self._after:
            _overwrite(tensor, after, version)
        self._after = []
        error = exc[1]
        if isinstance(error, RuntimeError) and not isinstance(error, torch.OutOfMemoryError) \
                and not str(error).startswith("stowage.plan:"):
            # an op the forward ran failed here: the block computes otherwise (a kept output of one
            # shape meeting a new input of another)
            raise _failed(self._where, "into an error", error) from error
        return result

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in UNMATCHED_OPS:
            return func(*args, **kwargs)
        position = self._position
        self._position += 1
        if position >= len(self._record.ops) or self._record.ops[position] is not func:
            recorded = self._record.ops[position] if position < len(self._record.ops) else "nothing"
            raise RuntimeError(f"stowage.plan: {self._where} ran {func} at op {position} when recomputed in "
                               f"backward where its forward ran {recorded}: a block whose ops change between "
                               "runs cannot be recomputed; leave it out of the plan (or make its forward "
                               "deterministic)")
        cached = self._record.cached[position]
        if cached is not None and cached.intact():
            return cached.outputs
        return func(*args, **kwargs)


def recompute_contexts(keep: Callable[[Any], bool], where: str) -> tuple[ForwardMode, ReplayMode]:
    """The (forward, recompute) context pair for torch.utils.checkpoint's ``context_fn``; `keep(func)`:
    whether the forward's next op keeps its outputs (stowage._core.RegionPolicy)."""
    record = RecomputeRecord()
    return ForwardMode(record, keep), ReplayMode(record, where)
