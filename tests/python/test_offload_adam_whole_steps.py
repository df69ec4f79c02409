"""stowage.offload.Adam / AdamW's step() is all or nothing (Note [Whole steps]): interrupted by
Ctrl-C at any line of its Python code, or by an error at any of its points (each bucket's update,
each write-back, the states kept on the device, the end), parameters and states (step counts,
moments, amsgrad's maxima, the device share) and a state_dict saved in the handler are torch's
with the step or torch's without it, and training on stays torch's; a Ctrl-C is never lost, and
one that comes while step() waits for its copies is acted on once the step is whole (CPU mode).

Ctrl-C is SIGINT sent to the process from a trace function (exactness.interrupts.CtrlC), so it
reaches any version of the optimizer; the errors come through the optimizer's seam
``_at_step_point``. The default run sends Ctrl-C at 16 lines spread over a step in each case
(seconds); ``--full`` at every line (300 to 500 a step; minutes).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from exactness.interrupts import CtrlC  # noqa: E402
from test_offload_adamw import batch, loss_of, make_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module", "one_thread")

HERE = Path(__file__).resolve().parent
HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
VARIANTS = {
    "plain": dict(),
    "amsgrad": dict(amsgrad=True),
    "amsgrad, a device share": dict(amsgrad=True, device_fraction=0.3),
}
# (update="delayed" updates the device share at once, not one update behind: its reference here
# has none)
CASES = [("exact", "plain"), ("exact", "amsgrad, a device share"), ("in_backward", "plain"),
         ("in_backward", "amsgrad, a device share"), ("delayed", "plain"), ("delayed", "amsgrad")]
STEPS_BEFORE = 1
SPREAD = 16  # lines interrupted in a case that does not take every line


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """torch on one thread: the ops are tiny, and on a busy 2-core machine a second thread's
    waits cost a hundred times the op (the interruptions run hundreds of steps)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Failure(RuntimeError):
    """The error injected at a point of step()."""


class FailAt:
    """The optimizer's step points, recorded; raises Failure at the `at`-th one (1-based; 0:
    records only)."""

    def __init__(self, at: int = 0) -> None:
        self.at, self.points = at, []

    def __call__(self, name: str) -> None:
        self.points.append(name)
        if len(self.points) == self.at:
            raise Failure(f"failed at {name}")


@contextlib.contextmanager
def failing_at(at: int, optimizer: Any) -> Iterator[None]:
    optimizer._at_step_point = FailAt(at)
    try:
        yield
    finally:
        optimizer._at_step_point = None


def train_step(model: Any, optimizer: Any, step: int) -> None:
    loss_of(model, batch(step)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def make_reference(update: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """torch's model and optimizer (update="delayed": with the parameters one update behind)."""
    from exactness.features import DelayedReference

    model = make_model()
    torch_options = {k: v for k, v in options.items() if k != "device_fraction"}
    if update == "delayed":
        return model, DelayedReference(lambda g: torch.optim.AdamW(g, **HYPER, **torch_options),
                                       [{"params": list(model.parameters())}])
    return model, torch.optim.AdamW(model.parameters(), **HYPER, **torch_options)


def make(update: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """The model and its offloaded optimizer, trained STEPS_BEFORE steps."""
    model = make_model()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update=update, bucket_numel=1000, **options)
    for step in range(STEPS_BEFORE):
        train_step(model, optimizer, step)
    return model, optimizer


class Torch:
    """torch's run, the one each interrupted run is held to: its checkpoint without the step
    and with it, and after two more steps (a checkpoint taken after the step, as the handler's)."""

    def __init__(self, update: str, options: dict[str, Any]) -> None:
        model, optimizer = make_reference(update, options)
        for step in range(STEPS_BEFORE):
            train_step(model, optimizer, step)
        loss_of(model, batch(STEPS_BEFORE)).backward()
        self.without = snapshot(model, optimizer)
        model, optimizer = make_reference(update, options)
        for step in range(STEPS_BEFORE):
            train_step(model, optimizer, step)
        train_step(model, optimizer, STEPS_BEFORE)
        self.with_step = snapshot(model, optimizer)
        for step in range(STEPS_BEFORE + 1, STEPS_BEFORE + 3):
            train_step(model, optimizer, step)
        self.trained_on = snapshot(model, optimizer)


def snapshot(model: Any, optimizer: Any) -> tuple[list[Any], dict[str, Any]]:
    """The parameters and the state_dict as a checkpoint would save them (for delayed updates,
    state_dict() writes the pending update back first, in both runs alike)."""
    saved = copy.deepcopy(optimizer.state_dict())
    return [p.detach().clone() for p in model.parameters()], saved


def differs(ours: tuple[list[Any], dict[str, Any]], theirs: tuple[list[Any], dict[str, Any]]) -> str | None:
    """Where two snapshots differ (bitwise: on this CPU the host update is torch's), or None."""
    for index, (a, b) in enumerate(zip(ours[0], theirs[0])):
        if not torch.equal(a, b):
            return f"parameter {index}"
    if sorted(ours[1]["state"]) != sorted(theirs[1]["state"]):
        return f"states of {sorted(ours[1]['state'])}, torch's of {sorted(theirs[1]['state'])}"
    for index, entry in theirs[1]["state"].items():
        for key, value in entry.items():
            got = ours[1]["state"][index][key]
            if not torch.equal(torch.as_tensor(got).float(), torch.as_tensor(value).float()):
                return f"state {index} {key}"
    return None


def points_of(update: str, options: dict[str, Any]) -> list[str]:
    """The points of one step of this optimizer, in order."""
    model, optimizer = make(update, options)
    recorder = FailAt()
    optimizer._at_step_point = recorder
    train_step(model, optimizer, STEPS_BEFORE)
    return recorder.points


def lines_of(update: str, options: dict[str, Any]) -> int:
    """How many lines of stowage's code one step() of this optimizer runs."""
    model, optimizer = make(update, options)
    loss_of(model, batch(STEPS_BEFORE)).backward()
    with CtrlC() as counter:
        optimizer.step()
    return counter.lines


def interrupted_run(update: str, options: dict[str, Any], reference: Torch,
                    interrupting: Callable[[Any], contextlib.AbstractContextManager[Any]],
                    error: type[BaseException]) -> str | None:
    """Step STEPS_BEFORE interrupted (`interrupting(optimizer)` around it: step() must raise
    `error`), a checkpoint saved in the handler, then (the step again if nothing of it was
    applied) two more steps: what differs from torch's, or None."""
    model, optimizer = make(update, options)
    step = STEPS_BEFORE
    loss_of(model, batch(step)).backward()
    try:
        with interrupting(optimizer):
            optimizer.step()
        return f"step() raised no {error.__name__}: the interruption was lost"
    except error:
        pass
    saved = snapshot(model, optimizer)  # a checkpoint saved in the handler
    stepped = differs(saved, reference.with_step) is None
    if not stepped and differs(saved, reference.without) is not None:
        return (f"the checkpoint is neither torch's with the step ({differs(saved, reference.with_step)}) nor "
                f"without it ({differs(saved, reference.without)})")
    if not stepped:
        optimizer.step()  # nothing was applied: the loop steps again
        optimizer.state_dict()  # (the checkpoint after it, as torch's run took one)
    optimizer.zero_grad(set_to_none=True)
    for later in range(step + 1, step + 3):
        train_step(model, optimizer, later)
    trained = differs(snapshot(model, optimizer), reference.trained_on)
    return None if trained is None else f"training on: {trained}"


@pytest.mark.parametrize("update, variant", CASES)
def test_ctrl_c_at_any_line_of_step_leaves_it_all_or_nothing_and_training_goes_on_as_torch_s(
        update: str, variant: str, request: Any) -> None:
    options = VARIANTS[variant]
    count = lines_of(update, options)
    assert count > SPREAD
    lines = range(1, count + 1) if request.config.getoption("--full") else sorted({1 + (count - 1) * k // (SPREAD - 1) for k in range(SPREAD)})
    reference = Torch(update, options)
    failures = []
    for line in lines:
        ctrl_c = CtrlC(at_line=line)
        found = interrupted_run(update, options, reference, lambda optimizer: ctrl_c, KeyboardInterrupt)
        if found is not None:
            failures.append(f"Ctrl-C at line {line} of {count} (in {ctrl_c.sent_at}): {found}")
    assert not failures, f"{len(failures)} of {len(lines)} lines:\n" + "\n".join(failures)


@pytest.mark.parametrize("update, variant", CASES)
def test_an_error_at_any_point_of_step_leaves_it_all_or_nothing_and_training_goes_on_as_torch_s(
        update: str, variant: str) -> None:
    options = VARIANTS[variant]
    points = points_of(update, options)
    assert "device" in points and "end" in points and sum(p.startswith("update") for p in points) > 1
    reference = Torch(update, options)
    failures = []
    for at, name in enumerate(points, 1):
        found = interrupted_run(update, options, reference, functools.partial(failing_at, at), Failure)
        if found is not None:
            failures.append(f"an error at {name}: {found}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("update", ["exact", "in_backward"])
def test_a_state_dict_saved_between_backward_and_step_pairs_the_states_with_their_parameters(update: str) -> None:
    """in_backward's updates made during backward are provisional: a state_dict saved before
    step() (a KeyboardInterrupt's handler during backward) holds the states of the last step,
    and step() still makes this one."""
    model, optimizer = make(update, {})
    reference = Torch(update, {})
    loss_of(model, batch(STEPS_BEFORE)).backward()
    assert differs(snapshot(model, optimizer), reference.without) is None
    optimizer.step()
    assert differs(snapshot(model, optimizer), reference.with_step) is None


SIGINT_SCRIPT = """
import os, signal, sys, threading, time, torch, stowage
signal.signal(signal.SIGINT, signal.default_int_handler)  # (a process started in the background ignores it)
stowage.enable(device="cpu", capacity="1GiB", copy_bandwidth="20MB")  # a slow link: copies wait
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 512))
reference = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 512))
reference.load_state_dict(model.state_dict())
hyper = dict(lr=1e-3, weight_decay=0.1)
optimizer = stowage.offload.AdamW(model.parameters(), **hyper, update="UPDATE", bucket_numel=100_000)
ref_optimizer = torch.optim.AdamW(reference.parameters(), **hyper)
batch = torch.randn(8, 512)
for m in (model, reference):
    m(batch).square().mean().backward()
ref_optimizer.step()

def interrupt_soon(frame, event, arg):
    # as step() begins writing parameters back: the signal comes while it waits for the copies
    if (event == "call" and frame.f_code.co_name == "_at_point" and frame.f_locals["name"].startswith("write_back")
            and not timers):
        timers.append(threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)))
        timers[0].start()

timers = []
started = time.monotonic()
sys.setprofile(interrupt_soon)
try:
    optimizer.step()
    print("no interrupt")
except KeyboardInterrupt:
    print(f"KeyboardInterrupt after {time.monotonic() - started:.2f} s")
sys.setprofile(None)
same = all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
steps = {float(s["step"]) for s in optimizer.state_dict()["state"].values()}
print("parameters", "torch's with the step" if same else "not torch's with the step", "steps", sorted(steps))
"""


@pytest.mark.parametrize("update", ["exact", "in_backward"])
def test_a_ctrl_c_while_step_waits_for_its_copies_is_raised_once_the_step_is_whole(update: str) -> None:
    script = SIGINT_SCRIPT.replace("UPDATE", update)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                            timeout=240, cwd=HERE)
    assert result.returncode == 0, result.stderr
    assert "KeyboardInterrupt after" in result.stdout, result.stdout
    assert "parameters torch's with the step steps [1.0]" in result.stdout, result.stdout
