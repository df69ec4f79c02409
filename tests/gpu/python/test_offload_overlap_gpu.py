"""stowage.offload.AdamW(overlap=True) on a real GPU (Note [Overlapped steps]): bit for bit the
step() that waits (the same host kernel; only when the copies and the update run changes), with a
loop that reads a parameter right after step(), one that writes it, a checkpoint taken while the
step is pending, and the loop on a stream of its own (the worker's copies follow it)."""

from __future__ import annotations

import copy
import io
from typing import Any, Callable

import torch

import stowage
from small_gpt import HYPER, small_gpt, tokens


def run(model: Any, optimizer: Any, steps: int, between: Callable[[Any], None] | None = None) -> list[float]:
    log: list[float] = []
    for step in range(steps):
        ids = tokens(step)
        model(ids, ids).backward()
        optimizer.step()
        if between is not None:
            log.append(between(model))
        model.zero_grad(set_to_none=True)  # (the module's: the next forward overlaps the step)
    optimizer.flush()
    torch.cuda.synchronize()
    return log


def pair() -> tuple[Any, Any, Any, Any]:
    model = small_gpt().to(torch.bfloat16)
    reference = copy.deepcopy(model)
    ours = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1 << 20, master_weights=True,
                                 overlap=True)
    theirs = stowage.offload.AdamW(reference.parameters(), **HYPER, bucket_numel=1 << 20, master_weights=True)
    return model, reference, ours, theirs


def assert_same(model: Any, reference: Any) -> None:
    for (name, p), r in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.detach(), r.detach()), name


def test_overlapped_steps_are_the_waiting_steps_bit_for_bit() -> None:
    model, reference, ours, theirs = pair()
    run(model, ours, 4)
    run(reference, theirs, 4)
    assert_same(model, reference)


def test_a_parameter_read_or_written_right_after_step_waits_for_it() -> None:
    def read(m: Any) -> float:
        return float(m.transformer.h[-1].mlp.c_proj.weight.float().norm())

    def write(m: Any) -> float:
        m.transformer.h[0].attn.c_attn.weight.data.clamp_(-0.02, 0.02)
        return float(m.lm_head.weight.float().sum())

    for between in (read, write):
        model, reference, ours, theirs = pair()
        assert run(model, ours, 3, between) == run(reference, theirs, 3, between)
        assert_same(model, reference)


def test_a_checkpoint_taken_while_the_step_is_pending_is_the_step_s_result() -> None:
    model, reference, ours, theirs = pair()
    run(reference, theirs, 2)
    run(model, ours, 1)
    ids = tokens(1)
    model(ids, ids).backward()
    ours.step()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)  # read while the step is pending: each tensor waits
    buffer.seek(0)
    saved = torch.load(buffer)
    for (name, value), r in zip(saved.items(), reference.state_dict().values()):
        assert torch.equal(value, r), name


def test_a_loop_on_a_stream_of_its_own_stays_exact() -> None:
    model, reference, ours, theirs = pair()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run(model, ours, 3)
    run(reference, theirs, 3)
    assert_same(model, reference)
