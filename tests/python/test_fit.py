"""stowage.fit: a step that does not fit its budget trains under it, with the states the table says
where it says and the numerics of torch's AdamW; a roomy budget changes nothing; what cannot fit,
and a model stowage does not serve, are refused with their reason; the demo fails without fit and
trains with it."""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.fitting import check_allocator  # noqa: E402
from stowage.models.llama import Llama, LlamaShape  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}
SHAPE = LlamaShape(hidden=128, layers=3, heads=4, kv_heads=2, vocab=1024, max_sequence=128)
# Embeddings and head large beside the activations: AdamW's two moments cannot stay on the device
# beside half the step, whatever the plan recomputes.
LARGE_STATES = LlamaShape(hidden=128, layers=2, heads=4, kv_heads=2, vocab=8192, max_sequence=128)
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def loss_fn(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    return model.chunked_loss(tokens, chunks=4)


def model_and_batch(shape: LlamaShape = SHAPE) -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    return Llama(shape), torch.randint(0, shape.vocab, (4, 128), generator=torch.Generator().manual_seed(1))


def reference_parameters(steps: int, shape: LlamaShape = SHAPE) -> list[torch.Tensor]:
    model, tokens = model_and_batch(shape)
    optimizer = torch.optim.AdamW(model.parameters(), **HYPER)  # type: ignore[arg-type]
    for _ in range(steps):
        loss_fn(model, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def unplanned_step_bytes(shape: LlamaShape = SHAPE) -> tuple[int, int]:
    """(in use before a step, what the step adds) for the test model, measured on a collected heap
    (fit does not count garbage either), the model and its gradients collected after."""
    gc.collect()
    model, tokens = model_and_batch(shape)
    before = stowage.memory_allocated()
    stowage.reset_peak_stats()
    loss_fn(model, tokens).backward()
    added = stowage.max_memory_allocated() - before
    del model, tokens
    gc.collect()
    return before, added


def fitted_for(budget: int, capsys: Any, shape: LlamaShape = SHAPE) -> tuple[Any, Any, torch.Tensor, str]:
    model, tokens = model_and_batch(shape)
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                         loss_fn=loss_fn, budget=budget, cost=COST)
    return fitted, model, tokens, capsys.readouterr().out


def test_a_step_over_its_budget_trains_under_it_with_adamw_s_numerics(capsys: Any) -> None:
    in_use, step_bytes = unplanned_step_bytes(LARGE_STATES)
    parameters = sum(p.numel() * 4 for p in model_and_batch(LARGE_STATES)[0].parameters())
    # Room for parameters, gradients, half the step and fit's margin (8 pages): torch's AdamW (2 x
    # parameters) cannot fit.
    budget = in_use + parameters + step_bytes // 2 + (16 << 20)
    fitted, model, tokens, table = fitted_for(budget, capsys, LARGE_STATES)
    assert fitted.device_fraction < 1.0 and isinstance(fitted.optimizer, stowage.offload.AdamW)
    assert fitted.plan is not None and "<- chosen" in table and "optimizer states" in table
    assert fitted.optimizer.device_fraction == fitted.device_fraction
    start = stowage.memory_allocated()
    for _ in range(3):
        stowage.reset_peak_stats()
        fitted.step(tokens)
        assert stowage.max_memory_allocated() <= budget * 1.05  # CPU mode counts torch's first-use buffers
    kept_states = fitted.chosen.device_state_bytes
    assert stowage.memory_allocated() <= start + kept_states + (1 << 20)  # nothing else left behind
    for ours, theirs in zip(model.parameters(), reference_parameters(3, LARGE_STATES)):
        torch.testing.assert_close(ours.detach(), theirs, rtol=1e-5, atol=1e-6)


def test_fit_plans_for_the_allocators_limit_below_the_device() -> None:
    """With the allocator's limit below the device's memory, fit's capacity is the limit: its
    table says which bound holds, and the step it chose trains under the limit."""
    in_use, step_bytes = unplanned_step_bytes(LARGE_STATES)
    parameters = sum(p.numel() * 4 for p in model_and_batch(LARGE_STATES)[0].parameters())
    limit = (in_use + parameters + step_bytes // 2 + (16 << 20) + (1 << 20) - 1) >> 20 << 20
    result = subprocess.run([sys.executable, "-c", f"""
import json, torch, stowage
from stowage.models.llama import Llama, LlamaShape
stowage.enable("limit:{limit}", device="cpu", capacity="1GiB")
torch.manual_seed(0)
model = Llama(LlamaShape(**{LARGE_STATES.__dict__!r}))
tokens = torch.randint(0, {LARGE_STATES.vocab}, (4, 128), generator=torch.Generator().manual_seed(1))
fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **{HYPER!r}), tokens,
                     loss_fn=lambda m, t: m.chunked_loss(t, chunks=4), cost={COST!r})
for _ in range(2):
    fitted.step(tokens)
print(json.dumps({{"fraction": fitted.device_fraction, "reserved": stowage.max_memory_reserved()}}))
"""], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    first = next(line for line in result.stdout.splitlines() if line.startswith("stowage.fit on"))
    assert f": {stowage.format_bytes(limit)} (the allocator's limit), " in first, first
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["fraction"] < 1.0, "torch's AdamW does not fit under the limit: fit offloads states"
    assert outcome["reserved"] <= limit


def test_the_host_s_room_bounds_the_states_fit_offloads(capsys: Any) -> None:
    """Each share's host bytes (16 a parameter: fp32 master, moments and one gradient buffer, for
    the parameters the share does not keep; and the plan's offloaded activations) are in the table, and the states the table says are
    on the device are those the optimizer keeps there; a share the host cannot hold is refused
    before training, and with no share left fit says the host is short."""
    in_use, step_bytes = unplanned_step_bytes(LARGE_STATES)
    count = sum(p.numel() for p in model_and_batch(LARGE_STATES)[0].parameters())
    # fit's margin (16 MiB), the gradients, half the step and 2 MiB: half of the states on the device
    # leaves room for a plan, all of them none
    budget = in_use + 4 * count + step_bytes // 2 + (18 << 20)
    model, tokens = model_and_batch(LARGE_STATES)
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                         loss_fn=loss_fn, budget=budget, cost=COST, host_budget=16 * count)
    table = capsys.readouterr().out
    assert "host memory" in table and "(host_budget)" in table
    kept = [p for g in fitted.optimizer._device_optimizer.param_groups for p in g["params"]] \
        if fitted.optimizer._device_optimizer is not None else []
    offloaded = sum(t.bytes for t, d in zip(fitted.plan.trace.tensors, fitted.plan.decisions) if d == stowage.plan.Decision.offload) \
        if fitted.plan is not None else 0
    # update="exact": 8 B a parameter of states, and the staging ring: one bucket here, one slot of
    # its parameters and gradients, 8 B a parameter more
    offloaded_count = count - sum(p.numel() for p in kept)
    assert fitted.facts["host"].staging_bytes(4 * offloaded_count) == 8 * offloaded_count
    assert fitted.chosen.host_bytes == 16 * offloaded_count + offloaded
    assert fitted.chosen.device_state_bytes == sum(8 * p.numel() for p in kept)
    shares = [o.fraction for o in fitted.options]
    assert len(set(o.host_bytes for o in fitted.options)) == len(shares)  # no two shares place the same
    del fitted, model, kept
    gc.collect()
    model, tokens = model_and_batch(LARGE_STATES)
    with pytest.raises(torch.OutOfMemoryError, match="the host cannot hold(.|\n)*more host memory"):
        stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                    loss_fn=loss_fn, budget=budget, cost=COST, host_budget=1 << 20, verbose=False)


def test_a_roomy_budget_changes_nothing(capsys: Any) -> None:
    fitted, model, tokens, table = fitted_for(1 << 30, capsys)
    assert fitted.device_fraction == 1.0 and fitted.plan is None
    assert type(fitted.optimizer) is torch.optim.AdamW and "step recorded at batch 4 x seq 128" in table
    for _ in range(2):
        fitted.step(tokens)
    for ours, theirs in zip(model.parameters(), reference_parameters(2)):
        assert torch.equal(ours.detach(), theirs)


def accumulate_and_clip(model: Any, optimizer: Any, tokens: torch.Tensor, steps: int, fitted: Any = None) -> None:
    """Two micro-batches a step, the loss a mean over both, gradients clipped to a norm that
    clips: torch's loop, or the same loop through ``fitted``'s methods."""
    micro = tokens.chunk(2)
    for _ in range(steps):
        for index, part in enumerate(micro):
            last = index == len(micro) - 1
            if fitted is None:
                (loss_fn(model, part) / len(micro)).backward()
                continue
            with fitted, (contextlib.nullcontext() if last else fitted.accumulating()):
                (loss_fn(model, part) / len(micro)).backward()
        if fitted is None:
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.05)
        else:
            fitted.clip_grad_norm_(0.05)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("room", ["roomy", "tight"])
def test_one_loop_accumulates_and_clips_as_torch_s_whatever_fit_chose(room: str, capsys: Any) -> None:
    """The same loop (``fitted.accumulating()``, ``fitted.clip_grad_norm_``) whether fit kept
    torch's AdamW or chose the offloaded one, and either way what torch's loop computes."""
    if room == "roomy":
        budget = 1 << 30
    else:
        in_use, step_bytes = unplanned_step_bytes(LARGE_STATES)
        parameters = sum(p.numel() * 4 for p in model_and_batch(LARGE_STATES)[0].parameters())
        budget = in_use + parameters + step_bytes // 2 + (16 << 20)
    fitted, model, tokens, _ = fitted_for(budget, capsys, LARGE_STATES)
    offloaded = isinstance(fitted.optimizer, stowage.offload.AdamW)
    assert offloaded == (room == "tight")
    accumulate_and_clip(model, fitted.optimizer, tokens, 2, fitted)
    reference, reference_tokens = model_and_batch(LARGE_STATES)
    accumulate_and_clip(reference, torch.optim.AdamW(reference.parameters(), **HYPER), reference_tokens, 2)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        if offloaded:  # the clipping coefficient applied in the host update: one rounding apart
            torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(ours.detach(), theirs.detach())


def test_a_loop_of_its_own_runs_its_backward_under_the_fit(capsys: Any) -> None:
    in_use, step_bytes = unplanned_step_bytes()
    fitted, model, tokens, _ = fitted_for(in_use + step_bytes // 2 + (40 << 20), capsys)
    for _ in range(2):
        with fitted:
            loss_fn(model, tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)  # a loop's own step between
        fitted.optimizer.step()
        fitted.optimizer.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="already running"):
        with fitted, fitted:
            pass


def test_what_cannot_fit_is_refused_with_every_share_weighed(capsys: Any) -> None:
    in_use, _ = unplanned_step_bytes()
    with pytest.raises(torch.OutOfMemoryError, match=r"does not fit in .* usable(.|\n)*0% of the states on the "
                       r"device \(room for the step [0-9.]+ [KM]iB\)(.|\n)*\(the batch runs whole: micro_batches=1; "
                       r"micro_batches='auto' lets fit cut it"):
        fitted_for(in_use + (20 << 20), capsys)  # the margin leaves room for the gradients alone
    with pytest.raises(TypeError, match="loss_fn"):  # its forward gives no loss
        stowage.fit(torch.nn.Linear(8, 8), torch.optim.AdamW, torch.zeros(4, 8))
    model, tokens = model_and_batch()
    with pytest.raises(ValueError, match="already holds states"):
        def used(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
            optimizer = torch.optim.AdamW(params)
            loss_fn(model, tokens).backward()
            optimizer.step()
            return optimizer

        stowage.fit(model, used, tokens, loss_fn=loss_fn)


def test_ranks_agree_on_a_share_every_rank_fits_timed_by_the_slowest() -> None:
    from stowage._core import agree_choice, pick_choice
    from stowage.fitting.choosing import TIE

    def pick(step_ms):
        return pick_choice(step_ms, TIE)

    def agree(per_rank):
        return agree_choice(per_rank, TIE)

    # choices are (share of states on the device, rows of a micro-batch, parameters on the host)
    D, H = False, True  # the blocks' parameters on the device, on the host
    assert pick({(1.0, 8, D): 100.0, (0.5, 8, D): 99.0, (0.0, 8, D): 90.0}) == (0.0, 8, D)  # the fastest, beyond the tie
    assert pick({(1.0, 8, D): 102.0, (0.5, 8, D): 100.0}) == (1.0, 8, D)  # within 3%: the most states on the device
    # within 3%: the fewest micro-batches first, then the most states on the device
    assert pick({(1.0, 4, D): 100.0, (0.5, 8, D): 102.0, (0.25, 8, D): 101.0}) == (0.5, 8, D)
    assert pick({}) is None
    # the blocks' parameters go to the host for a faster step only: within 3% they stay on the device
    assert pick({(1.0, 8, H): 99.0, (0.5, 8, D): 100.0}) == (0.5, 8, D)
    assert pick({(1.0, 8, H): 90.0, (0.5, 8, D): 100.0}) == (1.0, 8, H)
    # rank 0 alone would keep half the states; rank 1's device cannot, so both keep a quarter
    assert agree([{(0.5, 8, D): 100.0, (0.25, 8, D): 100.0, (0.0, 8, D): 100.0}, {(0.25, 8, D): 100.0, (0.0, 8, D): 100.0}]) \
        == (0.25, 8, D)
    # the slowest rank's time decides: a quarter is 10% slower on rank 1
    assert agree([{(0.25, 8, D): 100.0, (0.0, 8, D): 100.0}, {(0.25, 8, D): 110.0, (0.0, 8, D): 100.0}]) == (0.0, 8, D)
    assert agree([{(0.5, 8, D): 100.0}, {(0.25, 8, D): 100.0}]) is None
    # micro-batches too: rank 1 cannot run 8 rows at once, so both run 4 x 2
    assert agree([{(1.0, 8, D): 100.0, (1.0, 2, D): 120.0}, {(1.0, 2, D): 125.0}]) == (1.0, 2, D)


def test_a_device_stowage_does_not_serve_is_refused_with_the_fix() -> None:
    with pytest.raises(RuntimeError, match="STOWAGE_ALLOC_CONF(.|\n)*stowage.enable"):
        check_allocator(torch.device("cuda"))
    script = ("import torch, stowage\nfrom stowage.models.llama import Llama, LlamaShape\n"
              "model = Llama(LlamaShape(64, 1, 2, 2, 64))\n"
              "stowage.fit(model, torch.optim.AdamW, torch.zeros(2, 8, dtype=torch.long))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "stowage.enable(device='cpu'" in result.stderr


def test_a_model_built_before_cpu_mode_is_refused_with_the_fix() -> None:
    """A parameter whose memory CPU mode did not allocate (built before enable(); here, numpy's)
    would be left out of every figure fit plans with: refused, naming the fix; copied in, it fits."""
    model = torch.nn.Linear(64, 64)
    model.weight = torch.nn.Parameter(torch.from_numpy(numpy.zeros((64, 64), dtype=numpy.float32)))
    batch = torch.randn(4, 64)
    with pytest.raises(RuntimeError, match=r"1 of the model's 2 parameters \(16.00 KiB\)(.|\n)*after enable\(\)"):
        stowage.fit(model, torch.optim.AdamW, batch, loss_fn=lambda m, b: m(b).square().mean(), verbose=False)
    for p in model.parameters():
        p.data = p.data.clone()
    stowage.fit(model, torch.optim.AdamW, batch, loss_fn=lambda m, b: m(b).square().mean(), verbose=False)


def test_a_batch_the_model_cannot_take_names_loss_fn_before_anything_runs() -> None:
    """An (images, labels) batch for a classifier that takes images: model(*batch) cannot bind."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,)))
    with pytest.raises(TypeError, match=r"calls model\(\*batch\)(.|\n)*Sequential.forward does not take(.|\n)*loss_fn="):
        stowage.fit(model, torch.optim.AdamW, batch, verbose=False)
    fitted = stowage.fit(model, torch.optim.AdamW, batch, verbose=False,
                         loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))
    assert torch.isfinite(fitted.step(batch))


def test_an_output_that_is_not_a_loss_names_loss_fn_and_what_it_is() -> None:
    model = torch.nn.Linear(16, 10)
    with pytest.raises(TypeError, match=r"not a loss(.|\n)*a tensor of shape \(4, 10\)(.|\n)*loss_fn="):
        stowage.fit(model, torch.optim.AdamW, torch.randn(4, 16), verbose=False)


class RowsHungry(torch.nn.Module):
    """A step whose memory grows with the batch's rows: 96 MiB a row, held through backward."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        held = torch.ones(rows.shape[0], 24 << 20) * self.scale
        return held.mean()


def test_out_of_memory_under_fit_names_the_sizes_it_planned_for_and_the_batch_that_came() -> None:
    model = RowsHungry()
    fitted = stowage.fit(model, torch.optim.AdamW, torch.zeros(4, 8), verbose=False)
    fitted.step(torch.zeros(4, 8))
    with pytest.raises(torch.OutOfMemoryError, match=r"planned this step for batch 4 \(its example batch\); "
                                                     r"this batch is batch 64, larger"):
        fitted.step(torch.zeros(64, 8))
    with pytest.raises(torch.OutOfMemoryError, match=r"planned this step for batch 4(.|\n)*stowage.fit again"):
        with fitted:
            model(torch.zeros(64, 8)).backward()
    fitted.step(torch.zeros(4, 8))  # and it trains on after


def test_fit_s_own_steps_are_marked_in_the_history() -> None:
    """Its recording of the step and its rate probes lie between "snapshot" markers
    stowage.fit.trial_begin / trial_end (two pairs); training's steps after them."""
    stowage.record_history(True)
    try:
        model, tokens = model_and_batch()
        fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                             loss_fn=loss_fn, cost=COST, verbose=False)
        fitted.step(tokens)
        trace = stowage.snapshot()["device_traces"][0]
    finally:
        stowage.record_history(False)
    marks = [(i, e["user_metadata"]) for i, e in enumerate(trace) if e.get("user_metadata", "").startswith("stowage.fit")]
    assert [m for _, m in marks] == ["stowage.fit.trial_begin", "stowage.fit.trial_end"] * 2
    assert all(trace[i]["action"] == "snapshot" for i, _ in marks)
    first, last = marks[0][0], marks[-1][0]
    assert any(e["action"] == "alloc" for e in trace[first:marks[1][0]])  # the recorded step's
    assert any(e["action"] == "alloc" for e in trace[last:])  # training's, after fit


def test_the_demo_runs_out_of_memory_as_it_is_and_trains_with_fit(tmp_path: Any) -> None:
    snapshot = tmp_path / "demo.pickle"
    result = subprocess.run([sys.executable, "-m", "stowage", "demo", "--steps", "2", "--snapshot", str(snapshot)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "As it is (torch's AdamW, no plan): out of memory" in result.stdout
    assert "step does not fit whole: recorded at batch" in result.stdout
    assert "With stowage.fit: 2 steps trained" in result.stdout and snapshot.stat().st_size > 0


def test_the_plain_loop_example_trains_where_torch_s_adamw_cannot() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "plain_loop.py"
    result = subprocess.run([sys.executable, str(example), "--steps", "2"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "<- chosen" in result.stdout and "step 1: loss" in result.stdout


def test_the_hugging_face_trainer_example_trains_under_fit() -> None:
    """examples/hf_trainer.py at a small size: the Trainer's own loop, each step under the fit,
    its optimizer fit's; the plain step does not fit the device, the fitted one trains."""
    pytest.importorskip("transformers", reason="tools/bootstrap installs transformers for this test")
    example = Path(__file__).resolve().parents[2] / "examples" / "hf_trainer.py"
    result = subprocess.run([sys.executable, str(example), "--steps", "2", "--layers", "2", "--seq", "128",
                             "--capacity", "640MiB"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "<- chosen" in result.stdout and "'train_loss'" in result.stdout + result.stderr
    assert "no plan fits" in result.stdout  # torch's AdamW with every state on the device does not fit


FEATURE_ROWS_SCRIPT = """
import torch, stowage
from stowage.fitting.batches import BatchLayout
stowage.enable(device="cpu", capacity="96MiB")
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024), torch.nn.GELU())],
                            torch.nn.Linear(1024, 10))
rows = (torch.randn(3072, 1024), torch.randint(0, 10, (3072,)))
assert BatchLayout.of(rows).sizes == {"batch": 3072}  # a feature row's width is not a sequence
loss = lambda m, batch: torch.nn.functional.cross_entropy(m(batch[0]), batch[1])
try:  # a step that takes only the example's rows cannot be recorded at fewer
    stowage.fit(model, torch.optim.AdamW, rows, loss_fn=lambda m, batch: m(batch[0]).view(3072, 10).sum())
except ValueError as error:
    print("refused:", error)
fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=1e-3), rows, loss_fn=loss)
for step in range(2):
    stowage.reset_peak_stats()
    fitted.step(rows)
    print("peak", stowage.max_memory_allocated())
"""


def test_feature_rows_are_cut_by_rows_only_and_a_step_that_cannot_be_cut_is_refused() -> None:
    result = subprocess.run([sys.executable, "-c", FEATURE_ROWS_SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refused: stowage.fit: the step does not fit whole at batch 3072" in result.stdout
    assert "could not be recorded at any of them:\n  at batch {2, 3}: RuntimeError: shape" in result.stdout
    assert "step does not fit whole: recorded at batch {2, 3}, planned at batch 3072" in result.stdout
    peaks = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("peak ")]
    assert len(peaks) == 2 and max(peaks) <= 96 << 20


def test_a_busy_host_is_named_beside_the_predicted_times() -> None:
    from stowage._core import busy_host_note

    assert busy_host_note((1.5, 2)) == "" and busy_host_note(None) == ""
    note = busy_host_note((6.0, 2))
    assert "busy host (load 6.0 on 2 cores)" in note and "up to 3.0x long" in note


@pytest.mark.parametrize("knob, value", [("budget", "lots"), ("budget", -1), ("host_budget", "2 parsecs"),
                                         ("host_budget", 2**70)])
def test_a_bad_budget_is_refused_naming_it(knob: str, value: Any) -> None:
    model, tokens = model_and_batch()
    with pytest.raises((TypeError, ValueError), match=f"stowage.fit: {knob}"):
        stowage.fit(model, torch.optim.AdamW, tokens, loss_fn=loss_fn, cost=COST, verbose=False, **{knob: value})
