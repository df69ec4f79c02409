"""stowage.offload.AdamW(overlap=True) in CPU mode (Note [Overlapped steps]): step() returns while
the host part runs; bit for bit torch.optim.AdamW's parameters and states over several steps, with
loops that read a parameter, write it, zero gradients in place, clip, scale the loss, and save a
checkpoint right after step() that a fresh model and optimizer continue from; the next forward's
first module waits for its bucket while the step is held; a pending step's error surfaces once,
named; what cannot wait is refused."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.offload import landing  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
STEPS = 4


def make_model(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))


def batch(step: int) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 24, generator=generator), torch.randn(16, 8, generator=generator)


def loss_of(model: Any, step: int) -> Any:
    x, y = batch(step)
    return torch.nn.functional.mse_loss(model(x), y)


def overlapped(model: Any, **options: Any) -> Any:
    return stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1000, overlap=True, **options)


def twins(**options: Any) -> tuple[Any, Any, Any, Any]:
    """A model and its reference, the overlapped optimizer over the first and torch's over the other."""
    model, reference = make_model(), make_model()
    return model, reference, overlapped(model, **options), torch.optim.AdamW(reference.parameters(), **HYPER,
                                                                              foreach=False)


Between = Callable[[Any, Any, list[Any]], None]  # (model, optimizer, log): what the loop does after step()


def train(model: Any, optimizer: Any, steps: int, between: Between | None = None, clip: bool = False,
          loss_scale: float = 1.0, set_to_none: bool = True, first: int = 0) -> list[Any]:
    log: list[Any] = []
    for step in range(first, first + steps):
        (loss_of(model, step) * loss_scale).backward()
        if loss_scale != 1.0:
            for p in model.parameters():
                p.grad.div_(loss_scale)
        if clip:
            if isinstance(optimizer, stowage.offload.AdamW):
                optimizer.clip_grad_norm_(0.05)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        optimizer.step()
        if isinstance(optimizer, stowage.offload.AdamW):
            assert optimizer._landing is not None  # step() returned with its host part pending
        if between is not None:
            between(model, optimizer, log)
        model.zero_grad(set_to_none=set_to_none)  # (the module's: the next forward overlaps the step)
    return log


def assert_bitwise(ours: Any, reference: Any) -> None:
    for (name, a), b in zip(ours.named_parameters(), reference.parameters()):
        assert torch.equal(a.detach(), b.detach()), name


def assert_states_bitwise(ours: Any, reference: Any) -> None:
    theirs = reference.state_dict()["state"]
    for index, entry in ours.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(entry[key].cpu(), theirs[index][key].cpu()), (index, key)


def log_norms(model: Any, optimizer: Any, log: list[Any]) -> None:
    log.append([p.norm().item() for p in model.parameters()])


def clamp_first_weight(model: Any, optimizer: Any, log: list[Any]) -> None:
    model[0].weight.data.clamp_(-0.1, 0.1)


def copy_into_last(model: Any, optimizer: Any, log: list[Any]) -> None:
    with torch.no_grad():
        model[5].weight.copy_(model[5].weight * 0.5)


def ema_of_parameters(model: Any, optimizer: Any, log: list[Any]) -> None:
    if not log:
        log.append([p.detach().clone() for p in model.parameters()])
    torch._foreach_lerp_(log[0], [p.detach() for p in model.parameters()], 0.1)


def read_states(model: Any, optimizer: Any, log: list[Any]) -> None:
    log.append([optimizer.state[p]["exp_avg_sq"].sum().item() for p in model.parameters()])


@pytest.mark.parametrize("between", [None, log_norms, clamp_first_weight, copy_into_last, ema_of_parameters,
                                     read_states])
def test_overlapped_steps_match_torch_adamw_bit_for_bit(between: Between | None) -> None:
    model, reference, ours, theirs = twins()
    log = train(model, ours, STEPS, between)
    expected = train(reference, theirs, STEPS, between)
    for a, b in zip(log, expected):
        if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        else:
            assert a == b
    ours.flush()
    assert_bitwise(model, reference)
    assert_states_bitwise(ours, theirs)


@pytest.mark.parametrize("options", [dict(clip=True), dict(loss_scale=1024.0), dict(set_to_none=False)])
def test_clipping_loss_scaling_and_gradients_zeroed_in_place_stay_exact(options: dict[str, Any]) -> None:
    model, reference, ours, theirs = twins()
    train(model, ours, STEPS, **options)
    train(reference, theirs, STEPS, **options)
    assert_bitwise(model, reference)
    assert_states_bitwise(ours, theirs)


def test_gradients_zeroed_in_place_by_the_model_right_after_step_are_copied_out_first() -> None:
    model, reference, ours, theirs = twins()
    for step in range(STEPS):
        for m, o in ((model, ours), (reference, theirs)):
            loss_of(m, step).backward()
            o.step()
            m.zero_grad(set_to_none=False)  # the module's: in place, while the copies out may not have read them
    assert_bitwise(model, reference)


def test_a_checkpoint_saved_right_after_step_continues_bit_for_bit() -> None:
    model, reference, ours, theirs = twins()
    train(reference, theirs, 2 * STEPS)
    train(model, ours, STEPS)
    # one more step, and the checkpoint taken while it is pending: the model's first
    loss_of(model, STEPS).backward()
    ours.step()
    assert ours._landing is not None
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": ours.state_dict()}, buffer)
    ours.zero_grad()
    buffer.seek(0)
    saved = torch.load(buffer)
    fresh = make_model(seed=1)
    fresh.load_state_dict(saved["model"])
    resumed = overlapped(fresh)
    resumed.load_state_dict(saved["optimizer"])
    train(fresh, resumed, STEPS - 1, first=STEPS + 1)
    train(model, ours, STEPS - 1, first=STEPS + 1)
    assert_bitwise(fresh, reference)
    assert_bitwise(model, reference)
    assert_states_bitwise(resumed, theirs)


def test_a_model_state_dict_taken_while_pending_holds_the_step_s_result() -> None:
    model, reference, ours, theirs = twins()
    train(reference, theirs, 1)
    held = threading.Event()
    ours._at_step_point = lambda name: held.wait(5) if name == "update 0" else None
    loss_of(model, 0).backward()
    ours.step()
    threading.Timer(0.2, held.set).start()
    state = model.state_dict()  # waits for every bucket it reads
    for (name, value), b in zip(state.items(), reference.parameters()):
        assert torch.equal(value, b.detach()), name


def test_step_returns_while_the_update_is_held_and_the_first_module_waits() -> None:
    model = make_model()
    ours = overlapped(model)
    held = threading.Event()
    passed: list[str] = []

    def hold(name: str) -> None:
        passed.append(name)
        if name == "update 0":
            assert held.wait(10), "the test never released the step"

    ours._at_step_point = hold
    loss_of(model, 0).backward()
    started = time.monotonic()
    ours.step()  # returns with bucket 0's update held
    assert time.monotonic() - started < 5
    assert ours._landing is not None and not ours._landing.ended()
    assert "write_back 0" not in passed
    entered: list[float] = []
    model[0].register_forward_pre_hook(lambda module, args: entered.append(time.monotonic()))
    release_at = time.monotonic() + 0.3
    threading.Timer(0.3, held.set).start()
    model(batch(1)[0])
    assert entered and entered[0] >= release_at - 0.01  # the first module waited for its bucket
    assert "write_back 0" in passed


def test_without_overlap_step_does_not_return_while_the_update_is_held() -> None:
    model = make_model()
    ours = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1000)
    held = threading.Event()
    ours._at_step_point = lambda name: held.wait(10) if name == "update 0" else None
    loss_of(model, 0).backward()
    threading.Timer(0.3, held.set).start()
    started = time.monotonic()
    ours.step()
    assert time.monotonic() - started >= 0.25


def test_a_pending_step_s_error_surfaces_once_named_and_the_step_is_whole() -> None:
    model, reference, ours, theirs = twins()
    train(reference, theirs, 2)
    train(model, ours, 1)
    ours.flush()  # (step 1 landed before the seam is armed)
    failed = []

    def fail_once(name: str) -> None:
        if name == "update 1" and not failed:
            failed.append(name)
            raise RuntimeError("injected at update 1")

    ours._at_step_point = fail_once
    loss_of(model, 1).backward()
    ours.step()
    with pytest.raises(RuntimeError, match="injected at update 1") as raised:
        model(batch(2)[0])  # the first wait that meets the ended step
        ours.flush()
    assert any("step() number 2" in note and "overlap=True" in note for note in raised.value.__notes__)
    ours._at_step_point = None
    ours.flush()  # raised once, not again
    assert_bitwise(model, reference)  # the step was finished whole
    assert_states_bitwise(ours, theirs)


def test_the_mode_and_hook_are_taken_off_once_nothing_is_pending() -> None:
    model = make_model()
    ours = overlapped(model)
    depth = torch._C._len_torch_function_stack()
    loss_of(model, 0).backward()
    ours.step()
    assert torch._C._len_torch_function_stack() == depth + 1
    ours.flush()
    assert torch._C._len_torch_function_stack() == depth
    assert landing._hook is None


def test_a_compiled_module_waits_for_every_pending_step_at_its_entry() -> None:
    model = make_model()
    ours = overlapped(model)
    loss_of(model, 0).backward()
    ours.step()
    compiled = torch.compile(model, backend="eager")
    compiled(batch(1)[0])
    assert ours._landing is None or ours._landing.ended()
    assert torch._C._len_torch_function_stack() == 0 or not any(
        landing_.pending for landing_ in landing._landings)


def test_overlap_is_refused_where_it_cannot_hold() -> None:
    model = make_model()
    with pytest.raises(ValueError, match="overlap=True.*update='exact'"):
        stowage.offload.AdamW(model.parameters(), update="in_backward", overlap=True)
    with pytest.raises(ValueError, match="overlap=True.*update='exact'"):
        stowage.offload.AdamW(model.parameters(), update="delayed", overlap=True)


def zero_gradients_in_place(model: Any, optimizer: Any, log: list[Any]) -> None:
    model.zero_grad(set_to_none=False)


@pytest.mark.parametrize("between", [log_norms, clamp_first_weight, copy_into_last, ema_of_parameters, read_states,
                                     zero_gradients_in_place])
def test_what_the_loop_does_while_the_step_is_held_waits_for_it(between: Between) -> None:
    """The host part held at its first bucket's update while the loop reads or writes parameters,
    gradients or states: each waits, and the result is torch's bit for bit."""
    model, reference, ours, theirs = twins()
    expected = train(reference, theirs, 2, between)
    log: list[Any] = []
    for step in range(2):
        held = threading.Event()
        ours._at_step_point = lambda name, held=held: held.wait(10) if name == "update 0" else None
        loss_of(model, step).backward()
        ours.step()
        threading.Timer(0.2, held.set).start()
        between(model, ours, log)
        model.zero_grad(set_to_none=True)
    ours._at_step_point = None
    for a, b in zip(log, expected):
        if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        else:
            assert a == b
    assert_bitwise(model, reference)
    assert_states_bitwise(ours, theirs)


def test_a_view_taken_before_step_and_a_weight_used_functionally_wait_for_their_bucket() -> None:
    model, reference, ours, theirs = twins()
    views = [m[5].weight[:2] for m in (model, reference)]  # (taken before any step)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(9))
    seen: list[Any] = []
    for m, o, view in ((reference, theirs, views[1]), (model, ours, views[0])):
        held = threading.Event()
        o._at_step_point = lambda name, held=held: held.wait(10) if name.startswith("update") else None
        loss_of(m, 0).backward()
        o.step()
        threading.Timer(0.2, held.set).start()
        seen.append((view.sum().item(), torch.nn.functional.linear(x, m[3].weight).sum().item()))
        m.zero_grad(set_to_none=True)
    assert seen[0] == seen[1]


def test_dropping_gradients_through_the_model_does_not_wait_for_the_step() -> None:
    """model.zero_grad()'s ``p.grad = None`` reads and sets an attribute only: it returns while the
    step is held (the step holds the gradients it has not copied out), and the step stays exact."""
    model, reference, ours, theirs = twins()
    train(reference, theirs, 1)
    held = threading.Event()
    ours._at_step_point = lambda name: held.wait(10) if name == "update 0" else None
    loss_of(model, 0).backward()
    ours.step()
    release = threading.Timer(3.0, held.set)
    release.start()
    started = time.monotonic()
    model.zero_grad(set_to_none=True)
    assert time.monotonic() - started < 2.0
    assert all(p.grad is None for p in model.parameters())
    release.cancel()
    held.set()
    ours.flush()
    assert_bitwise(model, reference)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_the_optimizer_s_zero_grad_right_after_step_overlaps_and_stays_exact(set_to_none: bool) -> None:
    """optimizer.zero_grad() right after step(), the most common loop: dropping the gradients
    returns while the step is held, zeroing them in place waits for their copies out; the next
    forward overlaps, and the steps are torch's bit for bit."""
    model, reference, ours, theirs = twins()
    for step in range(3):
        loss_of(reference, step).backward()
        theirs.step()
        theirs.zero_grad(set_to_none=set_to_none)
    for step in range(3):
        held = threading.Event()
        ours._at_step_point = lambda name, held=held: held.wait(10) if name == "update 0" else None
        loss_of(model, step).backward()
        ours.step()
        release = threading.Timer(3.0 if set_to_none else 0.2, held.set)
        release.start()
        started = time.monotonic()
        ours.zero_grad(set_to_none=set_to_none)
        if set_to_none:
            assert time.monotonic() - started < 2.0, "zero_grad waited for the held step"
            assert ours._landing is not None and not ours._landing.ended()
            release.cancel()
            held.set()
        assert all(p.grad is None for p in model.parameters()) if set_to_none else \
            all(not p.grad.any() for p in model.parameters())
    ours._at_step_point = None
    ours.flush()
    assert_bitwise(model, reference)
    assert_states_bitwise(ours, theirs)


def test_a_process_that_exits_with_a_step_pending_finishes_it_and_exits_cleanly() -> None:
    script = (
        "import threading, time, torch, stowage\n"
        "stowage.enable(device='cpu', capacity='1GiB')\n"
        "model = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.Linear(64, 8))\n"
        "opt = stowage.offload.AdamW(model.parameters(), bucket_numel=1000, overlap=True)\n"
        "opt._at_step_point = lambda name: time.sleep(0.05)\n"
        "model(torch.randn(4, 24)).sum().backward()\n"
        "opt.step()\n"
        "print('returned', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "returned" in done.stdout


def test_a_grad_scaler_s_steps_and_skipped_step_are_the_waiting_step_s() -> None:
    """GradScaler hands its scale and inf check to step(): known before the host part starts, so
    the overlapped steps (one of them skipped for an inf) are the waiting optimizer's bit for bit."""
    runs = []
    for overlap in (False, True):
        model = make_model()
        optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1000, overlap=overlap)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        for step in range(STEPS):
            scaler.scale(loss_of(model, step)).backward()
            if step == 1:
                next(model.parameters()).grad[0, 0] = float("inf")  # an overflow: the step is skipped
            scaler.step(optimizer)
            scaler.update()
            model.zero_grad(set_to_none=True)
        optimizer.flush()
        runs.append((model, optimizer, scaler.get_scale()))
    (waiting, waiting_optimizer, scale), (ours, ours_optimizer, our_scale) = runs
    assert scale == our_scale == 1024.0 / 2
    assert_bitwise(ours, waiting)
    assert_states_bitwise(ours_optimizer, waiting_optimizer)


def test_a_step_inside_another_torch_function_mode_runs_whole_and_says_why() -> None:
    """A `with torch.device(...)` block is a TorchFunctionMode: its exit pops whatever mode is on top,
    so a step() inside one is not left pending (it warns once) and stays exact."""
    model, reference, ours, theirs = twins()
    train(reference, theirs, 2)
    depth = torch._C._len_torch_function_stack()
    with pytest.warns(UserWarning, match="TorchFunctionMode is active at step"):
        for step in range(2):
            loss_of(model, step).backward()
            with torch.device("cpu"):
                ours.step()
            assert ours._landing is None
            assert torch._C._len_torch_function_stack() == depth
            model.zero_grad(set_to_none=True)
    assert_bitwise(model, reference)
    assert_states_bitwise(ours, theirs)


@pytest.mark.parametrize("device_fraction", [0.5, 1.0])
def test_a_device_share_steps_in_step_and_the_rest_overlaps(device_fraction: float) -> None:
    model, reference, ours, theirs = twins(device_fraction=device_fraction)
    train(model, ours, STEPS, log_norms)
    train(reference, theirs, STEPS, log_norms)
    ours.flush()
    assert_bitwise(model, reference)
