"""Parameters off the device (``stowage.offload.parameters``): each unit's parameters (by default
the model's repeated blocks) live in host memory and come in, unit by unit, before forward and
again before backward need them. README's "Parameters off the device"; the schedule of which
copies are on the device is C++ (Note [Parameters off the device] in
offload/parameter_schedule.hpp): this module observes torch and applies its moves.

Each registered ``nn.Parameter`` keeps its identity and becomes a host tensor (``param.data`` is
host memory, its ``.grad`` a host tensor), so torch's optimizers update it on the host. Each has
one device copy: a leaf of the same requires_grad, the same object every step, swapped into its
modules while their unit runs; its storage is filled from the host parameter before each use and
freed after. Its gradient leaves the device as autograd makes it, on the engine's
device-to-host stream without a host wait each (Note [Gradients in flight] in
offload/gradient_queue.hpp); once its copy has landed, the host parameter's ``.grad`` is set to it
or added to in place (as torch's AccumulateGrad adds), then the host parameter's own
post-accumulate hooks run, in the order the gradients were made. Every gradient has landed before
backward returns, or, for a backward that raised, before the exception reaches the caller (where
autograd lets go of its graph task there) and at the latest at the handle's next forward or
close(): a loop between backward and step() sees torch's gradients.

Contract: one training thread; a handle is closed once (``close()`` puts every parameter back on
the device); at most one open handle holds a parameter.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import Any, Iterable, Optional

from stowage import step_context
from stowage.serving import is_cpu_allocator, torch_module

GradKey = Optional[tuple[int, int]]  # a gradient of the graph: (its node's mark, output)
_MARK = "stowage.offload.parameters"
_marks = itertools.count()

# The parameters an open handle holds: id(param) -> the handle.
_held: dict[int, weakref.ReferenceType[Any]] = {}


class ParameterOffloadError(RuntimeError):
    """What stowage.offload.parameters cannot keep exact, said before any difference."""


def parameters(model: Any, units: Iterable[Any] | None = None, prefetch: int = 1,
               gradient_bytes: int | None = None) -> OffloadedParameters:
    """Moves the parameters of each of `model`'s units (its repeated blocks, or `units`) to host
    memory; each unit's come back on the device while it runs in forward and backward, the next
    `prefetch` units' issued ahead. At most `gradient_bytes` of gradients are on their way to the
    host at once (default: the largest unit's trained parameters' bytes, its parameters' where none
    is trained yet). Returns the handle (a context
    manager; ``close()``)."""
    return OffloadedParameters(model, units, prefetch, gradient_bytes)


def home_device(param: Any) -> Any:
    """The device whose memory `param` left for the host while an open handle keeps it there
    (``param.data`` is then host memory; the optimizer updates it there), None where no open
    handle holds it."""
    ref = _held.get(id(param))
    handle = None if ref is None else ref()
    return None if handle is None or getattr(handle, "closed", True) else handle.device


def _device_of(model: Any, params: list[Any]) -> Any:
    """The one device of the model's parameters; refused where that is not a CUDA device or CPU
    mode's."""
    devices = {p.device for p in params}
    if len(devices) != 1:
        raise ParameterOffloadError(
            f"the units' parameters are on {sorted(map(str, devices))}: stowage.offload.parameters takes a model "
            "on one device (move it there first)")
    device = devices.pop()
    if device.type == "cpu" and not is_cpu_allocator():
        raise ParameterOffloadError(
            "the model is on a plain CPU device: its parameters have no device to leave; use a GPU, or CPU mode "
            "(stowage.enable(device='cpu', capacity=...)) to simulate one")
    if device.type not in ("cpu", "cuda"):
        raise ParameterOffloadError(f"stowage.offload.parameters takes a CUDA or CPU-mode model, not {device}")
    for name, p in model.named_parameters():
        if p.device != device:
            raise ParameterOffloadError(
                f"parameter {name} is on {p.device}, the units' on {device}: move the model to one device first")
    return device


def _refuse_wrapped(model: Any) -> None:
    torch = step_context.loaded_torch()
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        raise ParameterOffloadError(
            f"the model is wrapped in {type(model).__name__}: its gradient hooks expect the parameters on the "
            "device; stowage.offload.parameters takes the model unwrapped, on one device")
    for name, module in model.named_modules():
        kind = type(module).__name__
        if "FSDP" in kind or "FullyShardedDataParallel" in kind:
            raise ParameterOffloadError(
                f"module {name or '(the model)'} is {kind}: FSDP already moves its parameters "
                "(CPUOffloadPolicy); stowage.offload.parameters does not compose with it")
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
            raise ParameterOffloadError(
                f"module {name} makes sparse gradients: stowage.offload.parameters moves dense gradients only "
                "(make it sparse=False)")


def block_units(model: Any) -> list[Any]:
    """The units taken by default: the model's repeated blocks (step_context.block_modules) that
    hold parameters, in the model's order."""
    blocks = step_context.block_modules(model)
    return [m for m in model.modules() if id(m) in blocks and any(True for _ in m.parameters())]


def _units_of(model: Any, units: Iterable[Any] | None) -> list[Any]:
    if units is None:
        return block_units(model)
    modules = list(model.modules())
    chosen = list(units)
    known, unit_ids = {id(m) for m in modules}, {id(u) for u in chosen}
    for unit in chosen:
        if id(unit) not in known:
            raise ParameterOffloadError(f"unit {type(unit).__name__} is not a module of the model")
        for inner in unit.modules():
            if inner is not unit and id(inner) in unit_ids:
                raise ParameterOffloadError(
                    f"unit {type(inner).__name__} is inside unit {type(unit).__name__}: units must not nest")
    return chosen


def _refuse_shared_outside(model: Any, units: list[Any], offloaded: set[int]) -> None:
    """Refuses a unit's parameter that a module outside every unit holds too (it would read the
    host parameter)."""
    in_units = {id(m) for unit in units for m in unit.modules()}
    for name, inner in model.named_modules():
        if id(inner) in in_units:
            continue
        for pname, param in inner._parameters.items():
            if param is not None and id(param) in offloaded:
                raise ParameterOffloadError(
                    f"parameter {name}.{pname} is also held outside every unit (tied weights): offload "
                    "the modules that share it together (units=) or leave them on the device")


class _Slot:
    """One host parameter and its device copy, and where its modules hold it."""

    def __init__(self, param: Any, host: Any, copy: Any) -> None:
        self.param, self.host, self.copy = param, host, copy
        self.places: list[tuple[Any, str]] = []  # (module, name) in the units
        self.gradient_hooked = False
        self.gradients_sent = 0  # its gradients sent to the host and not yet applied
        self.gradient_buffer: Any = None  # the host memory its last gradient landed in, as a .grad


class _GraphToken:
    """Held by the hooks on a unit forward's outputs, which live as long as that forward's graph:
    a weak reference to it says whether the graph still waits for backward."""

    __slots__ = ("__weakref__",)


class _SentGradient:
    """A gradient on its way to the host: the slot, the host values its copy lands in, and the
    staging buffer under them (None: the values may become the host parameter's ``.grad``)."""

    __slots__ = ("slot", "values", "staging")

    def __init__(self, slot: int, values: Any, staging: Any) -> None:
        self.slot, self.values, self.staging = slot, values, staging


class OffloadedParameters:
    """The handle of ``stowage.offload.parameters``: the units, their parameters' host memory and
    device copies, the hooks that bring them in and take their gradients out."""

    def __init__(self, model: Any, units: Iterable[Any] | None, prefetch: int,
                 gradient_bytes: int | None = None) -> None:
        torch = step_context.loaded_torch()
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(f"prefetch is a count of units ahead (0 or more), not {prefetch!r}")
        if gradient_bytes is not None and (not isinstance(gradient_bytes, int) or isinstance(gradient_bytes, bool)
                                           or gradient_bytes < 0):
            raise ValueError(f"gradient_bytes is a count of bytes (0 or more), not {gradient_bytes!r}")
        _refuse_wrapped(model)
        self.units = _units_of(model, units)
        self._unit_slots: list[list[int]] = []
        self._slots: list[_Slot] = []
        self._handles: list[Any] = []
        by_param: dict[int, int] = {}
        params = [p for unit in self.units for p in unit.parameters()]
        if not params:
            raise ParameterOffloadError("the model has no unit with parameters to offload (pass units=)")
        self.device = _device_of(model, params)
        if self.device.type == "cpu":
            device_name = "cpu"  # CPU mode's simulated device
        else:  # stowage's CUDA allocator or torch's: the engine works over either
            device_name = f"cuda:{torch.cuda._get_device_index(self.device, optional=True)}"
        module = torch_module()
        self._store = module.HostStateStore(device_name)
        for param in params:
            if id(param) in _held and _held[id(param)]() is not None:
                raise ParameterOffloadError("a parameter of these units is already offloaded by another open handle")
            if param.is_sparse or param.layout != torch.strided:
                raise ParameterOffloadError("stowage.offload.parameters moves dense parameters only")
        _refuse_shared_outside(model, self.units, {id(p) for p in params})
        for unit in self.units:
            slots: list[int] = []
            for inner in unit.modules():
                for name, param in inner._parameters.items():
                    if param is None:
                        continue
                    if id(param) not in by_param:
                        by_param[id(param)] = len(self._slots)
                        self._slots.append(self._take(param))
                    slot = by_param[id(param)]
                    self._slots[slot].places.append((inner, name))
                    if slot not in slots:
                        slots.append(slot)
            self._unit_slots.append(slots)
        self._schedule = module.ParameterSchedule(
            [s.copy.numel() * s.copy.element_size() for s in self._slots], self._unit_slots, prefetch)
        if gradient_bytes is None:  # one unit's gradients, as fit's window counts them (its trained parameters')
            trained = [sum(self._slots[i].copy.numel() * self._slots[i].copy.element_size()
                           for i in slots if self._slots[i].param.requires_grad) for slots in self._unit_slots]
            gradient_bytes = max(trained) or max(self._schedule.unit_bytes(u) for u in range(len(self.units)))
        self._transfers = module.ParameterTransfers(device_name, gradient_bytes)
        self._sent: collections.deque[_SentGradient] = collections.deque()  # oldest first, not yet applied
        self._spare_staging: list[Any] = []  # host byte buffers for gradients added to a .grad
        # Held while gradients are sent or applied: a failed backward's may land on autograd's thread.
        self._landing = threading.RLock()
        for slot in self._slots:
            _held[id(slot.param)] = weakref.ref(self)
        self._backward_held = [False] * len(self.units)
        self._forward_holds = [0] * len(self.units)  # forwards of each unit running now
        # Each unit's forwards with grad since the last backward whose graphs are alive (weak references
        # to a token their outputs' hooks hold: a graph dropped unbackpropagated, a validation loss
        # outside no_grad, lets its token go).
        self._forward_graphs: list[list[weakref.ref[_GraphToken]]] = [[] for _ in self.units]
        self._backward_ended = False  # a backward ended since: the next forward counts afresh
        # Units called again while an earlier forward's graph of theirs waits for backward (a layer
        # shared across depths, as ALBERT's): their copies stay held from their first backward hold to
        # the end of backward (also through the end of a nested backward, a reentrant checkpoint's,
        # that comes before).
        self._repeated = [False] * len(self.units)
        self._backward_task = [-1] * len(self.units)  # the backward that last held each unit
        self._input_key: list[GradKey] = [None] * len(self.units)  # the gradient of its one input
        self._versions: list[list[int] | None] = [None] * len(self.units)  # host versions each forward saw
        self._callback_task = -1
        for u, unit in enumerate(self.units):
            self._handles.append(unit.register_forward_pre_hook(self._pre_forward_hook(u), with_kwargs=True))
            self._handles.append(unit.register_forward_hook(self._post_forward_hook(u), always_call=True))
        self.closed = False

    # --- setting up ----------------------------------------------------------------------------

    def _take(self, param: Any) -> _Slot:
        """Host memory for `param` (its values copied in) and its empty device copy."""
        torch = step_context.loaded_torch()
        host = self._host_copy(param.detach())
        copy = _device_copy_type()(torch.empty_like(host, device=self.device), requires_grad=param.requires_grad)
        copy.untyped_storage().resize_(0)
        param.data = host
        slot = _Slot(param, host, copy)
        if param.requires_grad:
            self._handles.append(param.register_hook(_used_outside_its_unit))
        return slot

    def _host_copy(self, values: Any) -> Any:
        host = self._store.empty(values.numel(), values.dtype).view(values.shape)
        host.copy_(values)
        return host

    @staticmethod
    def _tensor_hooks_of(param: Any) -> Any:
        """The host parameter's tensor hooks (register_hook), run on its copy's gradient in order."""

        def run(grad: Any) -> Any:
            for hook in list((param._backward_hooks or {}).values()):
                if hook is _used_outside_its_unit:
                    continue
                replaced = hook(grad)
                if replaced is not None:
                    grad = replaced
            return grad

        return run

    # --- applying the schedule -------------------------------------------------------------------

    def _apply(self, moves: tuple[list[int], list[int]]) -> None:
        fill, free = moves
        if free:
            self._transfers.filled()  # a prefetch let go: its fill completes before the memory is reused
        for i in free:  # (the plain class's calls cost nothing: the guard comes after)
            self._slots[i].copy.untyped_storage().resize_(0)
            _guard(self._slots[i].copy)
        if not fill:
            return
        copies = [self._slots[i].copy for i in fill]
        for i in fill:
            self._take_in_replaced(i)
            copy = self._slots[i].copy
            _unguard(copy)
            copy.untyped_storage().resize_(copy.numel() * copy.element_size())
        self._transfers.fill(copies, [self._slots[i].host for i in fill])

    def _take_in_replaced(self, i: int) -> None:
        """A loop's ``param.data = t`` replaced the host storage: its values are copied into host
        memory (refused while a graph saved the old values, which torch would still use)."""
        slot = self._slots[i]
        data = slot.param.data
        if data.untyped_storage().data_ptr() == slot.host.untyped_storage().data_ptr():
            return
        if data.shape != slot.host.shape or data.dtype != slot.host.dtype:
            raise ParameterOffloadError(
                f"a parameter of shape {tuple(slot.host.shape)} ({slot.host.dtype}) was replaced by one of shape "
                f"{tuple(data.shape)} ({data.dtype}): close the handle before changing a parameter's shape or dtype")
        if any(self._versions[u] is not None for u, slots in enumerate(self._unit_slots) if i in slots):
            raise ParameterOffloadError(
                "a parameter's storage was replaced (param.data = ...) while a forward that used it waits for "
                "backward: torch's backward would use the old values, which are gone from the host")
        slot.host = self._host_copy(data)
        slot.param.data = slot.host

    def _hold(self, u: int, backward: bool) -> None:
        """Holds unit `u`: its copies filled and waited for by the compute, the units ahead
        filled behind it (waited for when they start)."""
        fill, free = self._schedule.hold(u, backward)
        own = set(self._unit_slots[u])
        self._apply(([i for i in fill if i in own], free))
        self._transfers.filled()
        self._apply(([i for i in fill if i not in own], []))

    def _release(self, u: int) -> None:
        self._apply(self._schedule.release(u))

    def _place(self, u: int, copies: bool) -> None:
        """Puts unit `u`'s device copies (`copies`) or its host parameters in its modules."""
        for i in self._unit_slots[u]:
            slot = self._slots[i]
            value = slot.copy if copies else slot.param
            for inner, name in slot.places:
                inner._parameters[name] = value

    # --- the hooks ---------------------------------------------------------------------------------

    def _pre_forward_hook(self, u: int) -> Any:
        def pre_forward(module: Any, args: Any, kwargs: Any) -> None:
            if self.closed:
                return
            torch = step_context.loaded_torch()
            in_backward = step_context.in_backward()
            if not in_backward:
                self._settle_failed_backward()
            self._hold(u, in_backward)
            self._forward_holds[u] += 1
            for i in self._unit_slots[u]:
                slot = self._slots[i]
                if slot.copy.requires_grad != slot.param.requires_grad:
                    slot.copy.requires_grad_(slot.param.requires_grad)
                if slot.copy.requires_grad and not slot.gradient_hooked:
                    # (their handles go at close: a hook torch holds in C++ is out of the collector's sight)
                    self._handles.append(slot.copy.register_hook(self._tensor_hooks_of(slot.param)))
                    self._handles.append(slot.copy.register_post_accumulate_grad_hook(self._gradient_hook(i)))
                    slot.gradient_hooked = True
            self._place(u, copies=True)
            if torch.is_grad_enabled() and not in_backward:
                if self._backward_ended:
                    self._backward_ended = False
                    self._forward_graphs = [[] for _ in self.units]
                self._forward_graphs[u] = [ref for ref in self._forward_graphs[u] if ref() is not None]
                self._repeated[u] = bool(self._forward_graphs[u])
            if torch.is_grad_enabled():
                inputs = [a for a in _tensors((args, kwargs)) if a.requires_grad]
                if inputs and not in_backward:
                    self._input_key[u] = _gradient_of(inputs[0]) if len(inputs) == 1 else None
                if inputs:
                    done = self._inputs_done_hook(u, len(inputs))
                    for tensor in inputs:
                        tensor.register_hook(done)

        return pre_forward

    def _post_forward_hook(self, u: int) -> Any:
        def post_forward(module: Any, args: Any, output: Any) -> None:
            if self.closed or self._forward_holds[u] == 0:  # (its pre-forward failed)
                return
            self._forward_holds[u] -= 1
            torch = step_context.loaded_torch()
            if step_context.in_backward():
                # a recomputation: its hold is the unit's backward hold unless backward took one (the
                # copies stay in the unit's modules while backward holds it)
                if self._backward_held[u]:
                    self._release(u)
                else:
                    self._backward_held[u] = True
                return
            self._place(u, copies=False)
            outputs = [t for t in _tensors(output) if t.requires_grad] if torch.is_grad_enabled() else []
            if outputs:
                self._versions[u] = [self._slots[i].param._version for i in self._unit_slots[u]]
                token = _GraphToken()  # alive while a hook of its outputs' graph is
                self._forward_graphs[u].append(weakref.ref(token))
                for output in outputs:
                    output.register_hook(self._output_grad_hook(u, _marked_gradient(output), token))
            self._release(u)

        return post_forward

    def _output_grad_hook(self, u: int, key: GradKey, token: _GraphToken) -> Any:
        """The hook on each output of unit `u`'s forward: the output's gradient is complete, so
        the unit whose only input it is has passed backward (its copies go first: Note
        [Parameters off the device]), and the first of the outputs in this backward holds `u`."""

        def output_grad(grad: Any, graph: _GraphToken = token) -> None:  # (`graph`: held, not read)
            if self.closed:
                return
            torch = step_context.loaded_torch()
            for v, held in enumerate(self._backward_held):
                if held and not self._repeated[v] and _same_gradient(self._input_key[v], key):
                    self._backward_held[v] = False
                    self._place(v, copies=False)
                    self._release(v)
            task = torch._C._current_graph_task_id()
            # (a repeated unit let go by a nested backward's end, a reentrant checkpoint's, is held again)
            if self._backward_task[u] != task or (self._repeated[u] and not self._backward_held[u]):
                self._backward_task[u] = task
                self._pre_backward(u)

        return output_grad

    def _pre_backward(self, u: int) -> None:
        """Backward reached unit `u`'s outputs: its copies filled again (refused where they could
        not be what its forward used)."""
        torch = step_context.loaded_torch()
        if torch.is_grad_enabled():
            raise ParameterOffloadError(
                "backward with create_graph=True through offloaded parameters: the gradients' own graph would "
                "hold the device copies, which are freed after each unit; close the handle for higher-order "
                "gradients")
        versions = self._versions[u]
        if versions is not None:
            for i, seen in zip(self._unit_slots[u], versions):
                if self._slots[i].param._version != seen:
                    raise RuntimeError(
                        "one of the variables needed for gradient computation has been modified by an inplace "
                        f"operation: an offloaded parameter of shape {tuple(self._slots[i].param.shape)} is at "
                        f"version {self._slots[i].param._version}; expected version {seen} instead "
                        "(stowage.offload.parameters: its forward saw the earlier values)")
        self._queue_end_of_backward()
        if not self._backward_held[u]:
            self._hold(u, True)
            self._backward_held[u] = True
        # In the unit's modules until backward lets go of it: a recomputation that runs the unit's
        # forward without its hooks (transformers' checkpointing wraps forward, not the call) reads them.
        self._place(u, copies=True)

    def _inputs_done_hook(self, u: int, count: int) -> Any:
        """A hook for each of unit `u`'s `count` inputs: once every one has its gradient in a
        backward, that backward has passed the unit. (Not torch's register_multi_grad_hook: its
        "all" mode holds the inputs' nodes in the hooks they hold, a cycle through C++ that would
        keep this handle alive.) An input without a gradient leaves the unit to the end of backward."""
        arrived: dict[int, int] = {}

        def input_done(grad: Any) -> None:
            task = step_context.loaded_torch()._C._current_graph_task_id()
            arrived[task] = arrived.get(task, 0) + 1
            if arrived[task] < count:
                return
            del arrived[task]
            if self._backward_held[u] and not self._repeated[u] and not self.closed:
                self._backward_held[u] = False
                self._place(u, copies=False)
                self._release(u)

        return input_done

    def _gradient_hook(self, i: int) -> Any:
        def gradient_made(copy: Any) -> None:
            grad = copy.grad
            if grad is None or self.closed:
                return
            if grad.is_sparse:
                raise ParameterOffloadError("a sparse gradient reached an offloaded parameter: dense gradients only")
            self._queue_end_of_backward()
            with self._landing:
                self._transfers.landed()  # the older ones that have landed (never this one: not sent yet)
                self._apply_landed()
                self._send(i, grad)
                copy.grad = None  # its memory is held until the copy has read it
                self._transfers.land_over_bound()
                self._apply_landed()

        return gradient_made

    def _send(self, i: int, grad: Any) -> None:
        """Sends the gradient of slot `i` to the host: into a buffer that becomes the host
        parameter's ``.grad`` where it has none and none is on its way, else into staging."""
        slot = self._slots[i]
        staging = None
        if slot.param.grad is None and slot.gradients_sent == 0:
            values = self._gradient_buffer(slot, grad)
        else:
            staging = self._staging(grad.numel() * grad.element_size())
            values = staging.view(grad.dtype)[: grad.numel()]
        self._transfers.send_gradient(values, grad)
        self._sent.append(_SentGradient(i, values, staging))
        slot.gradients_sent += 1

    def _gradient_buffer(self, slot: _Slot, grad: Any) -> Any:
        """Host memory for a gradient that becomes `slot`'s ``.grad``: the buffer its last one
        landed in where nothing holds that any more (``zero_grad(set_to_none=True)`` let it go),
        else a new one, so a loop that kept the old ``.grad`` (or a view of it) keeps its values.
        Reused, a step pins no host memory for its gradients: each new buffer large enough is a
        pinned segment of its own, given back to the host when freed (offload/pinned_host_pool.hpp)."""
        kept = slot.gradient_buffer
        if kept is not None and kept.dtype == grad.dtype and kept.numel() == grad.numel() and _unshared(kept):
            return kept
        slot.gradient_buffer = self._store.empty(grad.numel(), grad.dtype)
        return slot.gradient_buffer

    def _staging(self, nbytes: int) -> Any:
        """A host byte buffer of at least `nbytes` (a multiple of 8, so any dtype views it): the
        smallest spare one that fits, else a new one. Staging is taken back as its gradient is
        applied, so the spares are at most the bytes that were in flight at once."""
        fitting = [k for k, b in enumerate(self._spare_staging) if b.numel() >= nbytes]
        if fitting:
            return self._spare_staging.pop(min(fitting, key=lambda k: self._spare_staging[k].numel()))
        return self._store.empty((nbytes + 7) // 8 * 8, step_context.loaded_torch().uint8)

    def _apply_landed(self) -> None:
        """The host side of each gradient whose copy has landed, oldest first: ``.grad`` set or
        added to, then the host parameter's post-accumulate hooks (a hook that raises leaves the
        rest to the next call)."""
        while len(self._sent) > self._transfers.gradients_in_flight:
            sent = self._sent.popleft()
            slot = self._slots[sent.slot]
            slot.gradients_sent -= 1
            param = slot.param
            landed = sent.values.view(param.shape)
            if param.grad is None:
                param.grad = landed if sent.staging is None else landed.clone()
            else:
                param.grad.add_(landed)
            if sent.staging is not None:
                self._spare_staging.append(sent.staging)
            for hook in list((param._post_accumulate_grad_hooks or {}).values()):
                hook(param)

    def _land_every_gradient(self) -> None:
        with self._landing:
            self._transfers.land_all()
            self._apply_landed()

    def _queue_end_of_backward(self) -> None:
        torch = step_context.loaded_torch()
        task = torch._C._current_graph_task_id()
        if task != self._callback_task:
            self._callback_task = task
            torch.autograd.Variable._execution_engine.queue_callback(_EndOfBackward(self))

    def _end_of_backward(self) -> None:
        self._land_every_gradient()
        self._callback_task = -1
        for u in range(len(self.units)):
            self._place(u, copies=False)
        self._apply(self._schedule.release_all())
        self._backward_held = [False] * len(self.units)
        self._backward_ended = True
        self._versions = [None] * len(self.units)
        self._input_key = [None] * len(self.units)

    def _settle_failed_backward(self) -> None:
        """A backward that raised left its holds, and maybe gradients in flight (where autograd let
        go of its graph task on its own thread, after the exception reached the caller): let them
        go, and land them, before the next forward."""
        if self._sent or self._callback_task != -1:
            with self._landing:
                self._land_every_gradient()
                if self._callback_task != -1:
                    self._end_of_backward()

    # --- the handle ----------------------------------------------------------------------------------

    @property
    def resident_bytes(self) -> int:
        """The bytes of the device copies filled now."""
        return int(self._schedule.resident_bytes)

    @property
    def peak_resident_bytes(self) -> int:
        return int(self._schedule.peak_resident_bytes)

    @property
    def host_bytes(self) -> int:
        return sum(s.host.numel() * s.host.element_size() for s in self._slots)

    def window_bytes(self) -> int:
        """The most the copies take on the device in forward: the running unit and `prefetch` more."""
        sizes = sorted((self._schedule.unit_bytes(u) for u in range(len(self.units))), reverse=True)
        return sum(sizes[: 1 + self._schedule.prefetch])

    def close(self) -> None:
        """Puts every parameter (and its gradient) back on the device; the hooks go."""
        if self.closed:
            return
        self._land_every_gradient()
        self.closed = True
        for handle in self._handles:
            handle.remove()
        self._schedule.release_all()
        self._restore_all()

    def _restore_all(self) -> None:
        torch = step_context.loaded_torch()
        for slot in self._slots:
            slot.copy.untyped_storage().resize_(0)
            _guard(slot.copy)
            param = slot.param
            on_device = torch.empty_like(param.data, device=self.device)
            on_device.copy_(param.data)
            param.data = on_device
            if param.grad is not None:
                param.grad = param.grad.to(self.device, copy=True)
            slot.gradient_buffer = None
            for inner, name in slot.places:
                inner._parameters[name] = param
            _held.pop(id(param), None)

    def __enter__(self) -> OffloadedParameters:
        return self

    def __exit__(self, *error: Any) -> None:
        self.close()


class _EndOfBackward:
    """The callback queued on a backward that reached an offloaded parameter: torch calls it when
    the backward ends, and only when it succeeds; one that raised drops it uncalled as autograd lets
    go of its graph task (before the exception reaches the caller where that task ran on the
    caller's thread), and the gradients in flight land then all the same (a hook of the host
    parameter that raises there is reported as Python reports errors in finalizers)."""

    def __init__(self, handle: OffloadedParameters) -> None:
        self._handle = weakref.ref(handle)
        self._called = False

    def __call__(self) -> None:
        self._called = True
        handle = self._handle()
        if handle is not None:
            handle._end_of_backward()

    def __del__(self) -> None:
        handle = self._handle()
        if not self._called and handle is not None and not handle.closed:
            handle._land_every_gradient()


# What may touch a device copy whose storage is freed: its storage, hooks and metadata, never its values.
_METADATA = frozenset({"untyped_storage", "__get__", "__set__", "numel", "element_size", "register_hook",
                       "register_post_accumulate_grad_hook", "requires_grad_", "size", "dim", "__hash__"})
_copy_type: Any = None


def _guard(copy: Any) -> None:
    """Makes a device copy whose storage was just freed refuse ops reading its values."""
    copy.__class__ = _device_copy_type()


def _unguard(copy: Any) -> None:
    """A filled device copy is a plain nn.Parameter: ops on it cost what they cost on any
    parameter (no Python guard on the hot path of a unit's forward and backward)."""
    copy.__class__ = step_context.loaded_torch().nn.Parameter


def _unshared(tensor: Any) -> bool:
    """Whether no tensor but `tensor` holds its storage (the count includes the storage object this
    asks through). torch without the count: taken as shared, so nothing is reused."""
    count = getattr(step_context.loaded_torch()._C, "_storage_Use_Count", None)
    return count is not None and count(tensor.untyped_storage()._cdata) <= 2


def _device_copy_type() -> Any:
    """The class of the device copies while their storage is freed (_guard, _unguard): an
    nn.Parameter that refuses, with a clear error, an op reading its values (a reference to a
    unit's weight taken during the unit's forward and used after it would read freed memory: a
    crash, or another tensor's bytes). Ops on it return plain tensors."""
    global _copy_type
    if _copy_type is not None:
        return _copy_type
    torch = step_context.loaded_torch()

    class DeviceCopy(torch.nn.Parameter):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            with torch._C.DisableTorchFunctionSubclass():
                if getattr(func, "__name__", "") not in _METADATA:
                    for value in (*args, *kwargs.values()):
                        for item in value if isinstance(value, (list, tuple)) else (value,):
                            if isinstance(item, cls) and item.untyped_storage().nbytes() == 0 and item.numel() > 0:
                                raise ParameterOffloadError(
                                    f"{getattr(func, '__name__', func)} read the device copy of an offloaded parameter "
                                    f"of shape {tuple(item.shape)} outside its unit's forward and backward, where it "
                                    "is freed: read the parameter itself (module.weight outside the forward is the "
                                    "host parameter), or keep the module on the device")
                return func(*args, **kwargs)

    _copy_type = DeviceCopy
    return _copy_type


def _marked_gradient(tensor: Any) -> GradKey:
    """Which gradient of the graph a unit's output's is: a number its node keeps in its metadata
    (numbers, not the node: a hook that held its own tensor's node would be a cycle through C++
    that the collector cannot see) and the output's index; None for a leaf."""
    if tensor.grad_fn is None:
        return None
    mark = tensor.grad_fn.metadata.setdefault(_MARK, next(_marks))
    return (mark, tensor.output_nr)


def _gradient_of(tensor: Any) -> GradKey:
    """The mark of a unit's input, where a unit's output made it (else None)."""
    if tensor.grad_fn is None or _MARK not in tensor.grad_fn.metadata:
        return None
    return (tensor.grad_fn.metadata[_MARK], tensor.output_nr)


def _same_gradient(a: GradKey, b: GradKey) -> bool:
    return a is not None and a == b


def _used_outside_its_unit(grad: Any) -> None:
    """A host parameter's own hook: a gradient reached it, so something used it outside its
    unit's forward (the device copy is what the unit uses)."""
    raise ParameterOffloadError(
        "an offloaded parameter was used outside its unit's forward (its module's forward swaps the device copy "
        "in; an attribute read elsewhere, such as a tied head's weight.t(), reads the host parameter): add the "
        "module that uses it to units=, or keep it on the device")


def _tensors(value: Any) -> list[Any]:
    """The tensors in a module's inputs or outputs (tuples, lists, dicts, dataclass-like outputs)."""
    torch = step_context.loaded_torch()
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        return _tensors(value.to_tuple())
    return []
