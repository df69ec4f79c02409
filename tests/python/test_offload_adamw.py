"""stowage.offload.AdamW in CPU mode: its parameters against torch.optim.AdamW's, state_dicts
both ways, loss scaling, clipping, accumulation, the update modes, DDP on two processes, and
the host-memory refusal."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402

HERE = Path(__file__).resolve().parent


pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def make_model(dtype: Any = torch.float32, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    return model.to(dtype)


def batch(step: int, dtype: Any = torch.float32, rows: int = 16) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(100 + step)
    return (torch.randn(rows, 24, generator=generator).to(dtype), torch.randn(rows, 8, generator=generator))


def loss_of(model: Any, data: tuple[Any, Any]) -> Any:
    x, y = data
    return torch.nn.functional.mse_loss(model(x).float(), y)


HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def train(model: Any, optimizer: Any, steps: int, micro_batches: int = 1, clip: str | None = None,
          accumulate: Callable[[Any], Any] | None = None) -> None:
    for step in range(steps):
        for micro in range(micro_batches):
            last = micro == micro_batches - 1
            context = accumulate(optimizer) if (accumulate and not last) else _null()
            with context:
                (loss_of(model, batch(step * micro_batches + micro)) / micro_batches).backward()
        if clip == "torch":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        elif clip == "optimizer":
            optimizer.clip_grad_norm_(0.05)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


def assert_parameters_close(ours: Any, reference: Any) -> None:
    for a, b in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("options", [
    dict(),
    dict(bucket_numel=1000),  # several buckets, one parameter larger than a bucket
    dict(update="in_backward", bucket_numel=1000),
    dict(device_fraction=0.5, bucket_numel=1000),
])
@pytest.mark.parametrize("clip", [None, "optimizer", "torch"])
def test_fp32_parameters_match_torch_adamw(options: dict[str, Any], clip: str | None) -> None:
    if clip == "torch" and options.get("update") == "in_backward":
        pytest.skip("in_backward refuses clipping through torch (tested below)")
    model, reference = make_model(), make_model()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, **options)
    train(model, optimizer, steps=6, clip=clip)
    train(reference, torch.optim.AdamW(reference.parameters(), **HYPER), steps=6,
          clip=None if clip is None else "torch")
    assert_parameters_close(model, reference)


def test_gradient_accumulation_copies_only_the_final_gradients() -> None:
    model, reference = make_model(), make_model()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update="in_backward", bucket_numel=1000)
    train(model, optimizer, steps=4, micro_batches=3, accumulate=lambda o: o.accumulating())
    train(reference, torch.optim.AdamW(reference.parameters(), **HYPER), steps=4, micro_batches=3)
    assert_parameters_close(model, reference)


def test_unmarked_accumulation_is_still_exact_by_default_and_refused_in_backward() -> None:
    model, reference = make_model(), make_model()
    train(model, stowage.offload.AdamW(model.parameters(), **HYPER), steps=3, micro_batches=2)
    train(reference, torch.optim.AdamW(reference.parameters(), **HYPER), steps=3, micro_batches=2)
    assert_parameters_close(model, reference)
    eager = make_model()
    optimizer = stowage.offload.AdamW(eager.parameters(), **HYPER, update="in_backward")
    with pytest.raises(RuntimeError, match="arrived twice"):
        train(eager, optimizer, steps=1, micro_batches=2)


def test_bf16_parameters_with_master_weights_follow_fp32_adamw_rounded_to_bf16() -> None:
    model = make_model(torch.bfloat16)
    reference = copy.deepcopy(model).float()  # the fp32 masters torch would keep
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1000, master_weights=True)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), **HYPER)
    for step in range(5):
        loss_of(model, batch(step, torch.bfloat16)).backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            r.grad = p.grad.float()  # the same gradients: only the update is compared
        optimizer.step()
        ref_optimizer.step()
        optimizer.zero_grad()
        ref_optimizer.zero_grad()
    for p, r in zip(model.parameters(), reference.parameters()):
        expected = r.detach().to(torch.bfloat16).float()
        ulp = expected.abs() * 2.0 ** -7 + 1e-30
        assert ((p.detach().float() - expected).abs() <= ulp).all()
        torch.testing.assert_close(optimizer.state[p]["master"], r.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bf16_and_fp16_parameters_keep_torch_s_states_in_their_own_precision(dtype: Any) -> None:
    # torch's AdamW on such parameters keeps its moments in their precision; within the spread
    # between torch's own fused and single-tensor AdamW on the same gradients, twice over.
    def run(make: Any) -> tuple[Any, Any]:
        model = make_model(dtype)
        optimizer = make(model.parameters())
        for step in range(4):
            torch.manual_seed(step)
            for p in model.parameters():
                p.grad = (torch.randn(p.shape) * 1e-2).to(dtype)
            optimizer.step()
        return model, optimizer

    ours, ours_optimizer = run(lambda ps: stowage.offload.AdamW(ps, **HYPER, bucket_numel=1000))
    single, _ = run(lambda ps: torch.optim.AdamW(ps, **HYPER, foreach=False))
    fused, _ = run(lambda ps: torch.optim.AdamW(ps, **HYPER, fused=True))
    entry = ours_optimizer.state_dict()["state"][0]
    assert entry["exp_avg"].dtype == dtype and "master" not in entry
    stats = ours_optimizer.host_stats()  # two moments of 2 bytes (blocks rounded up), and the staging ring
    assert stats["allocated_bytes"] - stats["staging_bytes"] < 5 * sum(p.numel() for p in ours.parameters())
    for a, b, c in zip(ours.parameters(), single.parameters(), fused.parameters()):
        # (torch's single-tensor path divides by an eps fp16 cannot hold: where it gives NaN the
        # spread is taken as none)
        spread = torch.nan_to_num((b.float() - c.float()).abs(), nan=0.0, posinf=0.0).max()
        ulp = b.float().abs().max() * (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10)
        assert (a.float() - c.float()).abs().max() <= 2 * max(spread, ulp)


def test_state_dict_moves_between_torch_adamw_and_ours_both_ways() -> None:
    ours_model, torch_model = make_model(), make_model()
    ours = stowage.offload.AdamW(ours_model.parameters(), **HYPER, bucket_numel=1000)
    theirs = torch.optim.AdamW(torch_model.parameters(), **HYPER)
    train(ours_model, ours, steps=3)
    train(torch_model, theirs, steps=3)
    # ours -> torch, torch -> ours, each continuing from the other's checkpoint
    a_model, b_model = copy.deepcopy(ours_model), copy.deepcopy(torch_model)
    into_torch = torch.optim.AdamW(a_model.parameters(), **HYPER)
    into_torch.load_state_dict(ours.state_dict())
    into_ours = stowage.offload.AdamW(b_model.parameters(), **HYPER)
    into_ours.load_state_dict(theirs.state_dict())
    for model, optimizer in ((a_model, into_torch), (b_model, into_ours), (torch_model, theirs)):
        train(model, optimizer, steps=2)
    assert_parameters_close(a_model, torch_model)
    assert_parameters_close(b_model, torch_model)
    assert int(into_ours.state_dict()["state"][0]["step"]) == 5


def test_resuming_from_a_checkpoint_gives_the_same_next_step(tmp_path: Path) -> None:
    model = make_model(torch.bfloat16)
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, master_weights=True)
    for step in range(3):
        loss_of(model, batch(step, torch.bfloat16)).backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "ckpt.pt")
    assert "master" in optimizer.state_dict()["state"][0]
    resumed_model = make_model(torch.bfloat16, seed=1)
    resumed = stowage.offload.AdamW(resumed_model.parameters(), **HYPER, master_weights=True)
    checkpoint = torch.load(tmp_path / "ckpt.pt")
    resumed_model.load_state_dict(checkpoint["model"])
    resumed.load_state_dict(checkpoint["optimizer"])
    for m, o in ((model, optimizer), (resumed_model, resumed)):
        loss_of(m, batch(3, torch.bfloat16)).backward()
        o.step()
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(optimizer.state.values(), resumed.state.values()):
        assert torch.equal(a["master"], b["master"])


def test_a_torch_checkpoint_without_masters_starts_them_from_the_parameters() -> None:
    model = make_model(torch.bfloat16)
    theirs = torch.optim.AdamW(model.parameters(), **HYPER)
    loss_of(model, batch(0, torch.bfloat16)).backward()
    theirs.step()
    ours = stowage.offload.AdamW(model.parameters(), **HYPER, master_weights=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # weights loaded after the optimizer was made
    ours.load_state_dict(theirs.state_dict())
    for p in model.parameters():
        assert torch.equal(ours.state[p]["master"], p.detach().float())


def test_a_grad_scaler_inf_skips_the_step_with_nothing_applied() -> None:
    model = make_model(torch.float16)
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1000, master_weights=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(loss_of(model, batch(0, torch.float16))).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    states = copy.deepcopy({k: {n: t.clone() for n, t in v.items()} for k, v in optimizer.state_dict()["state"].items()})
    scaler.scale(loss_of(model, batch(1, torch.float16))).backward()
    first = next(model.parameters())
    first.grad[0, 0] = float("inf")  # an overflow in one gradient
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    assert scaler.get_scale() == 512.0
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
    after = optimizer.state_dict()["state"]
    for index, entry in states.items():
        for name, value in entry.items():
            assert torch.equal(after[index][name], value), (index, name)
    # and the next finite step applies, unscaled: as torch's AdamW on the fp32 masters would
    reference = copy.deepcopy(model).float()
    with torch.no_grad():
        for p, r in zip(model.parameters(), reference.parameters()):
            r.copy_(optimizer.state[p]["master"])
    ref_optimizer = torch.optim.AdamW(reference.parameters(), **HYPER)
    ref_optimizer.load_state_dict({"state": {i: {k: v.clone() for k, v in e.items() if k != "master"}
                                             for i, e in after.items()},
                                   "param_groups": optimizer.state_dict()["param_groups"]})
    scaler.scale(loss_of(model, batch(2, torch.float16))).backward()
    for p, r in zip(model.parameters(), reference.parameters()):
        r.grad = p.grad.float() / scaler.get_scale()
    scaler.step(optimizer)
    ref_optimizer.step()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(optimizer.state[p]["master"], r.detach(), rtol=1e-5, atol=1e-6)


def test_in_backward_refuses_clipping_through_torch_with_its_reason() -> None:
    model = make_model()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update="in_backward")
    loss_of(model, batch(0)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with pytest.raises(RuntimeError, match="changed afterwards(.|\n)*optimizer.clip_grad_norm_"):
        optimizer.step()


def test_in_backward_clipping_through_the_optimizer_is_exact_and_says_what_it_costs() -> None:
    model, reference = make_model(), make_model()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update="in_backward", bucket_numel=1000)
    with pytest.warns(UserWarning, match="undoes the updates made during backward"):
        train(model, optimizer, steps=3, clip="optimizer")
    train(reference, torch.optim.AdamW(reference.parameters(), **HYPER), steps=3, clip="torch")
    assert_parameters_close(model, reference)


def test_delayed_updates_apply_each_update_one_step_late() -> None:
    # Gradients that do not depend on the weights: the delayed run ends where the exact one does.
    def run(update: str) -> list[Any]:
        weight = torch.nn.Parameter(torch.ones(3000))
        optimizer = stowage.offload.AdamW([weight], **HYPER, update=update, bucket_numel=1000)
        seen = []
        for step in range(4):
            seen.append(weight.detach().clone())
            (weight * torch.linspace(-1, 1 + step, 3000)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        optimizer.flush()
        return seen + [weight.detach().clone()]

    exact, delayed = run("exact"), run("delayed")
    assert torch.equal(delayed[1], exact[0])  # after step 1: nothing applied yet
    for step in range(2, 4):
        assert torch.equal(delayed[step], exact[step - 1])
    assert torch.equal(delayed[4], exact[4])  # flush() applies the last


def test_states_live_in_the_pinned_host_pool_in_cpu_mode() -> None:
    model = make_model(torch.bfloat16)
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, master_weights=True)
    numel = sum(p.numel() for p in model.parameters())
    stats = optimizer.host_stats()
    assert stats["allocated_bytes"] >= numel * (12 + 2 + 2)
    assert stats["pinned_bytes"] + stats["pageable_bytes"] >= stats["allocated_bytes"]


def test_the_states_and_the_activations_share_one_pinned_pool_whose_arena_still_settles() -> None:
    """One pinned pool per device (Note [One pinned arena]): the optimizer's states are its
    resident blocks, so memory_stats()'s offload.pinned.* bytes count them, and the activations'
    arena still settles between steps while they are held; they go back with the optimizer. In a
    fresh interpreter: CPU mode's pool is per process, and an earlier test's arena may fit these
    steps already."""
    script = """
        import gc, torch, stowage
        from offload_models import MlpStack
        from test_offload_adamw import HYPER
        stowage.enable(device="cpu", capacity="4GiB")
        torch.manual_seed(0)
        model = MlpStack(blocks=2, width=128, hidden=512)
        optimizer = stowage.offload.AdamW(model.parameters(), **HYPER)
        states = optimizer.host_stats()["allocated_bytes"]
        assert states >= 8 * sum(p.numel() for p in model.parameters()), states
        stats = stowage.memory_stats()
        assert stats["offload.pinned.allocated_bytes.current"] == states, (stats, states)
        assert stats["offload.pinned.reserved_bytes.current"] >= states
        settles = [stats.get("offload.pinned.num_settles", 0)]
        for rows in (1024, 2048, 1024, 3072):  # activations of 2 MiB and more: the arena's large class
            with stowage.offload.activations(min_bytes="64KiB"):
                loss = model(torch.randn(rows, 128)).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stowage.mark_step()
            stats = stowage.memory_stats()
            assert stats["offload.pinned.allocated_bytes.current"] == states, "only the states stay"
            settles.append(stats["offload.pinned.num_settles"])
        assert settles[1] > settles[0] and settles[4] > settles[2], f"the arena did not settle: {settles}"
        assert optimizer.host_stats()["allocated_bytes"] == states
        reserved = stats["offload.pinned.reserved_bytes.current"]
        optimizer.close()
        del optimizer
        gc.collect()
        after = stowage.memory_stats()
        assert after["offload.pinned.allocated_bytes.current"] == 0
        assert after["offload.pinned.reserved_bytes.current"] <= reserved - states, "the states' segments stayed"
        print("settles", settles)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300, cwd=HERE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "settles" in done.stdout


@pytest.mark.parametrize("update, out", [("exact", 2), ("delayed", 1)])
def test_the_optimizer_s_copies_are_counted_in_the_offload_statistics(update: str, out: int) -> None:
    """Gradients out and parameters back cross the offload engine's streams, so memory_stats()'s
    offload.* copy counters see them, beside the activations' offloads: each step moves every
    gradient out and every parameter back, once; update="exact" moves each parameter out too (it
    keeps no copy of them, Note [Staged buckets])."""
    model = make_model()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update=update)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    before = stowage.memory_stats()
    train(model, optimizer, steps=2)
    after = stowage.memory_stats()
    moved = {key: after[key] - before.get(key, 0) for key in ("offload.to_host.bytes", "offload.to_device.bytes",
                                                        "offload.to_host.num_copies", "offload.to_device.num_copies")}
    parameters = len(list(model.parameters()))
    optimizer.close()  # (delayed: the last step's write-back)
    moved["offload.to_device.bytes"] = stowage.memory_stats()["offload.to_device.bytes"] - before["offload.to_device.bytes"]
    moved["offload.to_device.num_copies"] = (stowage.memory_stats()["offload.to_device.num_copies"]
                                             - before["offload.to_device.num_copies"])
    assert moved == {"offload.to_host.bytes": 2 * out * parameter_bytes, "offload.to_device.bytes": 2 * parameter_bytes,
                     "offload.to_host.num_copies": 2 * out * parameters,
                     "offload.to_device.num_copies": 2 * parameters}


@pytest.mark.parametrize("dtype, master_weights, per_parameter", [
    (torch.float32, False, 8), (torch.bfloat16, False, 4), (torch.float16, False, 4), (torch.bfloat16, True, 12)])
def test_exact_mode_keeps_on_the_host_only_what_torch_keeps_as_state(dtype: Any, master_weights: bool,
                                                                      per_parameter: int) -> None:
    """update="exact" (Note [Staged buckets]): the moments (fp32 for fp32 parameters, the
    parameter's own precision for narrow ones; fp32 masters too with master_weights), measured in
    host_stats(), plus the staging ring: one bucket's parameters and gradients a slot. The other
    modes keep a copy of the parameters and gradient buffers besides."""
    torch.manual_seed(0)  # parameters of 2^18 elements: every block a multiple of the pool's rounding
    model = torch.nn.Sequential(torch.nn.Linear(512, 512, bias=False), torch.nn.Linear(512, 512, bias=False)).to(dtype)
    numel = sum(p.numel() for p in model.parameters())
    for update, states, staging in [("exact", per_parameter, 2 * numel * dtype.itemsize), ("delayed", None, 0)]:
        optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update=update, master_weights=master_weights)
        stats = optimizer.host_stats()
        assert stats["staging_bytes"] == staging  # one bucket: one slot
        if states is not None:
            assert stats["allocated_bytes"] - stats["staging_bytes"] == states * numel
            assert stowage.offload.adam.torch_module().staged_bytes_per_parameter(dtype, False, master_weights) == states
        else:
            assert stats["allocated_bytes"] >= (per_parameter + 2 * dtype.itemsize) * numel  # + params' copy, grads
        optimizer.close()


def test_the_staging_ring_does_not_grow_with_the_bucket_count() -> None:
    """Three slots of the largest bucket's parameters and gradients, whatever the bucket count;
    steps over many buckets still match torch's AdamW bit for bit."""
    def ring(blocks: int) -> tuple[int, int, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(32, 32, bias=False) for _ in range(blocks)])
        optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=32 * 32)
        return optimizer.host_stats()["staging_bytes"], optimizer._slots.bucket_count, (model, optimizer)

    few, few_buckets, _ = ring(3)
    many, many_buckets, (model, optimizer) = ring(40)
    assert few_buckets == 3 and many_buckets == 40
    assert many == few == 3 * 2 * 4 * 32 * 32
    reference = copy.deepcopy(model)
    torch_optimizer = torch.optim.AdamW(reference.parameters(), **HYPER, foreach=False)
    for step in range(3):
        torch.manual_seed(step)
        x = torch.randn(4, 32)
        for m, o in ((model, optimizer), (reference, torch_optimizer)):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.equal(p, q), step


def test_asking_for_more_host_memory_than_allowed_fails_at_construction() -> None:
    model = make_model()
    numel = sum(p.numel() for p in model.parameters())
    with pytest.raises(stowage.offload.HostMemoryError) as caught:
        stowage.offload.AdamW(model.parameters(), host_memory_limit=numel * 8)
    message = str(caught.value)
    assert f"({numel * 16} bytes)" in message and f"({numel * 8} bytes)" in message
    assert "host_memory_limit" in message
    stowage.offload.AdamW(model.parameters(), host_memory_limit=numel * 16)  # exactly enough


def test_a_dropped_optimizer_is_freed_while_the_model_lives_on() -> None:
    import gc
    import weakref
    model = make_model()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER)
    train(model, optimizer, 1)
    gone = weakref.ref(optimizer)
    del optimizer
    gc.collect()
    assert gone() is None  # the parameters' hooks hold it weakly
    loss_of(model, batch(0)).backward()  # the hooks left behind do nothing
    replacement = stowage.offload.AdamW(model.parameters(), **HYPER)
    replacement.zero_grad(set_to_none=True)
    train(model, replacement, 2)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_bad_arguments_are_refused_with_their_reason() -> None:
    params = list(make_model().parameters())
    with pytest.raises(ValueError, match="differentiable=True"):
        stowage.offload.AdamW(params, differentiable=True)
    with pytest.raises(ValueError, match="float32, bfloat16 and float16"):
        stowage.offload.AdamW([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))])
    with pytest.raises(ValueError, match="update must be"):
        stowage.offload.AdamW(params, update="sometimes")
    with pytest.raises(ValueError, match="device_fraction"):
        stowage.offload.AdamW(params, device_fraction=1.5)
    with pytest.raises(ValueError, match="Invalid beta"):
        stowage.offload.AdamW(params, betas=(1.0, 0.9))
    optimizer = stowage.offload.AdamW(params)
    with pytest.raises(ValueError, match="one device"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, device="meta"))]})
    with pytest.raises(ValueError, match="groups do not match"):
        optimizer.load_state_dict({"state": {}, "param_groups": []})


def test_a_compiled_model_trains_as_the_eager_one() -> None:
    model, reference = make_model(), make_model()
    compiled = torch.compile(model, backend="aot_eager")
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update="in_backward", bucket_numel=1000)
    train(compiled, optimizer, steps=3)
    train(reference, torch.optim.AdamW(reference.parameters(), **HYPER), steps=3)
    assert_parameters_close(model, reference)


def run_two_ranks(script_text: str, tmp_path: Path, *extra: str) -> tuple[Any, Any]:
    """Runs `script_text` as ranks 0 and 1 of a gloo group; returns what each saved."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(script_text))
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), port, str(tmp_path / f"rank{r}.pt"), *extra],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = [rank.communicate(timeout=240)[0] for rank in ranks]
    # both ranks' outputs: when one rank fails, the other usually reports only the closed connection
    assert all(rank.returncode == 0 for rank in ranks), "\n".join(
        f"rank {r} exited {rank.returncode}:\n{output}" for r, (rank, output) in enumerate(zip(ranks, outputs)))
    return torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")


RANK_PRELUDE = """
import gc, os, sys, weakref, torch, torch.distributed as dist
import stowage
from test_offload_adamw import make_model, batch, loss_of, HYPER
rank, world, port, out = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
stowage.enable(device="cpu", capacity="1GiB")
dist.init_process_group("gloo", rank=rank, world_size=world)
HOLDERS = []  # weak references to what holds the group or tensors on it (the model, DDP, the optimizer)
PRELUDE_NAMES = set(globals()) | {"PRELUDE_NAMES"}
"""
# DDP's and FSDP2's state keep the gloo group after destroy_process_group(), and a gloo group
# destroyed during interpreter shutdown joins its worker threads there, whose last references to
# tensors then take the GIL of an interpreter being finalized (torch's hazard, pytorch#190489: a
# SIGABRT as the rank exits). So what the script made goes first, and the group with it, while
# the interpreter is whole; nothing else may still hold the group.
RANK_END = """
for name in [n for n in globals() if n not in PRELUDE_NAMES]:
    del globals()[name]
gc.collect()
alive = [type(ref()).__name__ for ref in HOLDERS if ref() is not None]
assert not alive, f"{alive} outlive the script, and the process group with them"
dist.destroy_process_group()
"""

DDP_SCRIPT = RANK_PRELUDE + """
model = make_model()
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
optimizer = stowage.offload.AdamW(ddp.parameters(), **HYPER, update=sys.argv[4], bucket_numel=1000)
optimizer.attach(ddp)
HOLDERS += [weakref.ref(o) for o in (model, ddp, optimizer)]
for step in range(4):
    x, y = batch(step, rows=16)
    with ddp.no_sync():  # a first micro-batch, accumulated locally
        torch.nn.functional.mse_loss(ddp(x[rank * 4:rank * 4 + 4]).float(), y[rank * 4:rank * 4 + 4]).mul(0.5).backward()
    torch.nn.functional.mse_loss(ddp(x[8 + rank * 4:12 + rank * 4]).float(), y[8 + rank * 4:12 + rank * 4]).mul(0.5).backward()
    optimizer.step()
    optimizer.zero_grad()
torch.save([p.detach() for p in model.parameters()], out)
""" + RANK_END


@pytest.mark.parametrize("update", ["exact", "in_backward"])
def test_ddp_on_two_gloo_ranks_matches_one_process_on_the_whole_batch(tmp_path: Path, update: str) -> None:
    first, second = run_two_ranks(DDP_SCRIPT, tmp_path, update)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    reference = make_model()
    ref_optimizer = torch.optim.AdamW(reference.parameters(), **HYPER)
    for step in range(4):
        x, y = batch(step, rows=16)
        # each rank's two micro-batches of 4 rows, averaged over ranks: the mean over all 16
        torch.nn.functional.mse_loss(reference(x).float(), y).backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    for a, b in zip(first, reference.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)


FSDP2_SCRIPT = RANK_PRELUDE + """
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
model = make_model()
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1000)
HOLDERS += [weakref.ref(o) for o in (model, optimizer)]
for step in range(4):
    x, y = batch(step, rows=16)
    torch.nn.functional.mse_loss(model(x[rank * 8:rank * 8 + 8]).float(), y[rank * 8:rank * 8 + 8]).backward()
    optimizer.clip_grad_norm_(0.05)
    optimizer.step()
    optimizer.zero_grad()
state = optimizer.state_dict()["state"]
assert all(isinstance(e["exp_avg"], DTensor) for e in state.values()), "states sharded like the parameters"
optimizer.load_state_dict(optimizer.state_dict())  # sharded states load back into the shards
assert all(torch.equal(state[i]["exp_avg"].to_local(), e["exp_avg"].to_local())
           for i, e in optimizer.state_dict()["state"].items())
full = [p.full_tensor().detach() for p in model.parameters()]
stats = optimizer.host_stats()
host = stats["allocated_bytes"] - stats["staging_bytes"]
torch.save({"params": full, "host_bytes": host,
            "exp_avg": [state[i]["exp_avg"].full_tensor() for i in sorted(state)]}, out)
""" + RANK_END


def test_fsdp2_on_two_gloo_ranks_keeps_each_rank_s_shard_and_matches_one_process(tmp_path: Path) -> None:
    first, second = run_two_ranks(FSDP2_SCRIPT, tmp_path)
    for a, b in zip(first["params"], second["params"]):
        assert torch.equal(a, b)
    reference = make_model()
    numel = sum(p.numel() for p in reference.parameters())
    # each rank holds about half the states (8 B a parameter for fp32, besides the staging ring), not all of them
    assert first["host_bytes"] < 0.75 * 8 * numel and second["host_bytes"] < 0.75 * 8 * numel
    ref_optimizer = torch.optim.AdamW(reference.parameters(), **HYPER)
    for step in range(4):
        x, y = batch(step, rows=16)
        torch.nn.functional.mse_loss(reference(x).float(), y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    for a, b in zip(first["params"], reference.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)
    for a, p in zip(first["exp_avg"], reference.parameters()):
        torch.testing.assert_close(a, ref_optimizer.state[p]["exp_avg"], rtol=1e-5, atol=1e-7)


def test_close_writes_back_what_is_pending_and_lets_go_of_the_hooks() -> None:
    model = make_model()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update="delayed", bucket_numel=1000)
    train(model, optimizer, steps=2)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.close()
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), before))  # the pending update landed
    loss_of(model, batch(0)).backward()  # no hook copies anything any more
    assert not any(optimizer._slots.arrived(index) for index in range(len(optimizer._slots)))
