"""stowage.fit's batch arithmetic: a global batch that does not fit whole runs as the micro-batches
fit chooses, computing what torch computes for the same accumulation (bit for bit) and the global
batch's step up to rounding, the loss weighted by the units the example batch verifies; losses
that are no mean and BatchNorm refuse a cut; a loop of its own cannot run more rows than planned.
(The measured cases of losses weighted otherwise: test_fit_loss_units.py.)"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.plan  # noqa: E402
from stowage.fitting import batches  # noqa: E402
from stowage.fitting.batches import BatchLayout  # noqa: E402
from stowage.fitting.batches import ROWS, given_units  # noqa: E402
from stowage._core import MicroCut  # noqa: E402
from stowage.fitting.batches import ExampleBatch, weighted  # noqa: E402
from stowage.models.llama import Llama, LlamaShape  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}


def split(batch, micro_rows):
    """`batch` cut into the fewest near-equal micro-batches of at most `micro_rows` rows (MicroCut)."""
    layout = BatchLayout.of(batch)
    return layout.pieces(batch, MicroCut(layout.rows, 1, micro_rows).bounds(layout.rows))


SHAPE = LlamaShape(hidden=128, layers=3, heads=4, kv_heads=2, vocab=1024, max_sequence=128)
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
ROWS_IN_BATCH = 8


def loss_fn(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    return model.chunked_loss(tokens, chunks=4)


def llama_and_batch() -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    tokens = torch.randint(0, SHAPE.vocab, (ROWS_IN_BATCH, 128), generator=torch.Generator().manual_seed(1))
    return Llama(SHAPE), tokens


def lowest_peaks() -> tuple[int, int]:
    """The lowest planned peak of the whole batch's step and of half of it, as fit profiles them."""
    model, tokens = llama_and_batch()

    def step(batch: int) -> None:
        loss_fn(model, BatchLayout.of(tokens).at(tokens, {"batch": batch})).backward()
        model.zero_grad(set_to_none=True)

    sized = stowage.plan.profile(step, sizes={"batch": (2, 3)}, cost=COST, model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(stowage.plan.solve(sized.at({"batch": rows}), 1).predicted_peak_bytes  # type: ignore[return-value]
                     for rows in (ROWS_IN_BATCH, ROWS_IN_BATCH // 2))


def test_a_batch_too_large_to_fit_whole_runs_as_micro_batches_computing_torch_s_accumulation(capsys: Any) -> None:
    whole, half = lowest_peaks()
    gc.collect()  # the profiled model, out of the memory in use before fit counts it
    model, tokens = llama_and_batch()
    trainable = sum(p.numel() * 4 for p in model.parameters())
    assert half + trainable < whole  # half the batch fits beside the gradients where the whole does not
    room = (half + trainable + whole) // 2
    # every state on the device (two moments, torch's AdamW kept), fit's margin of 8 pages
    budget = stowage.memory_allocated() + 2 * trainable + room + (16 << 20)
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                         loss_fn=loss_fn, budget=budget, cost=COST, micro_batches="auto", offload_optimizer=False)
    table = capsys.readouterr().out
    assert fitted.chosen.micro_batches >= 2 and fitted.chosen.micro_rows <= ROWS_IN_BATCH // 2
    assert f"{fitted.chosen.micro_batches} micro-batches of up to {fitted.chosen.micro_rows} rows" in table
    assert "whole (8)" in table and "no plan fits" in table  # the whole batch was weighed, and does not fit
    assert fitted.units.name == "rows"
    start = stowage.memory_allocated()
    stowage.reset_peak_stats()
    losses = [fitted.step(tokens) for _ in range(2)]
    assert stowage.max_memory_allocated() - start <= budget - start
    assert fitted.plan is None or fitted.plan.departed_steps == 0
    ours = [p.detach().clone() for p in model.parameters()]

    reference, tokens = llama_and_batch()
    optimizer = torch.optim.AdamW(reference.parameters(), **HYPER)  # type: ignore[arg-type]
    pieces = split(tokens, fitted.chosen.micro_rows)
    expected_losses = []
    for _ in range(2):
        total = torch.zeros(())
        for piece in pieces:
            loss = loss_fn(reference, piece)
            (loss * (piece.shape[0] / ROWS_IN_BATCH)).backward()
            total = total + loss.detach() * (piece.shape[0] / ROWS_IN_BATCH)
        expected_losses.append(total)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for got, expected in zip(losses, expected_losses):
        assert torch.equal(got, expected)
    for got, expected in zip(ours, reference.parameters()):
        assert torch.equal(got, expected)


def test_a_loop_of_its_own_may_not_run_more_rows_than_fit_planned_a_micro_batch_for() -> None:
    model, tokens = llama_and_batch()
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                         loss_fn=loss_fn, cost=COST, micro_batches=2, verbose=False)
    assert fitted.chosen.micro_batches == 2
    with pytest.raises(RuntimeError, match="8 rows; fit planned micro-batches of 4 rows"):
        with fitted:
            loss_fn(model, tokens).backward()
    assert all(p.grad is None for p in model.parameters())  # refused before the forward ran
    pieces = fitted.micro_batches(tokens)
    assert [w for _, w in pieces] == [0.5, 0.5]
    for piece, weight in pieces:
        with fitted:
            (loss_fn(model, piece) * weight).backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=True)
    with fitted:  # a micro-batch's rows pass
        loss_fn(model, tokens[:4]).backward()


class SumLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 4)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.layer(rows).square().sum()  # a sum over the rows, not a mean


def test_a_loss_that_is_no_mean_keeps_the_batch_whole_or_refuses_a_cut_asked_for(capsys: Any) -> None:
    torch.manual_seed(0)
    model, rows = SumLoss(), torch.randn(8, 16)
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params), rows, micro_batches="auto", cost=COST)
    assert fitted.chosen.micro_batches == 1 and fitted.units is None
    assert "not cut: the loss of the whole batch" in capsys.readouterr().out
    with pytest.raises(ValueError, match="micro_batches=2 cannot be kept to the global batch's step: the loss of "
                                         r"the whole batch \(.*\) is not its micro-batches' weighted by rows.*"
                                         "loss_units="):
        stowage.fit(model, lambda params: torch.optim.AdamW(params), rows, micro_batches=2, verbose=False)
    # said by the caller, the units are taken as given
    told = stowage.fit(model, lambda params: torch.optim.AdamW(params), rows, micro_batches=2, verbose=False,
                       loss_units=lambda batch: 1, cost=COST)
    assert [w for _, w in told.micro_batches(rows)] == [0.5, 0.5]


def conv_net() -> Any:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5))


def test_batchnorm_keeps_the_batch_whole_unless_the_caller_allows_a_cut(capsys: Any) -> None:
    torch.manual_seed(0)
    model, batch = conv_net(), (torch.randn(8, 3, 12, 12), torch.randint(0, 5, (8,)))

    def cross_entropy(m: Any, b: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params), batch, loss_fn=cross_entropy,
                         micro_batches="auto", cost=COST)
    assert fitted.chosen.micro_batches == 1
    assert ("not cut: aten.native_batch_norm in module '1' computes statistics over the rows it sees together"
            in capsys.readouterr().out)
    with pytest.raises(ValueError, match="native_batch_norm in module '1' computes statistics.*split_batchnorm=True"):
        stowage.fit(model, lambda params: torch.optim.AdamW(params), batch, loss_fn=cross_entropy, micro_batches=2,
                    verbose=False)
    allowed = stowage.fit(model, lambda params: torch.optim.AdamW(params), batch, loss_fn=cross_entropy,
                          micro_batches=2, split_batchnorm=True, verbose=False, cost=COST)
    assert allowed.chosen.micro_batches == 2 and allowed.units.name == "rows"
    model.eval()  # in eval mode BatchNorm uses its running statistics: nothing to refuse
    evaluated = stowage.fit(model, lambda params: torch.optim.AdamW(params), batch, loss_fn=cross_entropy,
                            micro_batches=2, verbose=False, cost=COST)
    assert evaluated.chosen.micro_batches == 2


def hf_batch(vocab: int, rows: int = 8, length: int = 24, causal: bool = True) -> dict[str, torch.Tensor]:
    """Token labels with rows of different lengths (padding labelled -100), as a collator makes."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    labels = ids.clone() if causal else torch.full_like(ids, -100)
    for row in range(rows):
        labels[row, length - 3 * row:] = -100
        if not causal:
            labels[row, row % 5::3] = ids[row, row % 5::3]
            labels[row, length - 3 * row:] = -100
    return {"input_ids": ids, "labels": labels}


def accumulated_gradients(model: Any, batch: dict[str, torch.Tensor], pieces: list[tuple[Any, float]]) -> list[Any]:
    model.zero_grad(set_to_none=True)
    for piece, weight in pieces:
        (model(**piece).loss * weight).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("kind", ["causal", "masked"])
def test_a_hugging_face_token_loss_is_weighted_by_its_tokens(kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "causal":  # the loss over labels[..., 1:] (shifted inside the model)
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32,
                                         attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
        model, expected = transformers.GPT2LMHeadModel(config), "entries of batch['labels'][:, 1:] not -100"
    else:  # the loss over every label not ignored
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                         intermediate_size=128, vocab_size=256, max_position_embeddings=32,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model, expected = transformers.BertForMaskedLM(config), "entries of batch['labels'] not -100"
    batch = hf_batch(256, causal=kind == "causal")
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params), batch, micro_batches=2, verbose=False,
                         cost=COST)
    assert fitted.units is not None and fitted.units.name == expected
    pieces = fitted.micro_batches(batch)
    counts = [fitted.units.count(piece) for piece, _ in pieces]
    assert [w for _, w in pieces] == [c / sum(counts) for c in counts] and counts[0] != counts[1]
    # fitted.backward is torch's accumulation with these weights, bit for bit
    expected_grads = accumulated_gradients(model, batch, pieces)
    model.zero_grad(set_to_none=True)
    loss = fitted.backward(batch)
    for p, grad in zip(model.parameters(), expected_grads):
        assert torch.equal(p.grad, grad)
    # ... and the whole batch's step up to rounding (weighted by rows it would not be)
    model.zero_grad(set_to_none=True)
    whole = model(**batch).loss
    whole.backward()
    assert torch.allclose(loss, whole.detach(), rtol=1e-5)
    for p, grad in zip(model.parameters(), expected_grads):
        assert torch.allclose(p.grad, grad, rtol=1e-3, atol=1e-6)
    by_rows = accumulated_gradients(model, batch, [(piece, 0.5) for piece, _ in pieces])
    assert not all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(by_rows, expected_grads))
    model.zero_grad(set_to_none=True)


def test_micro_batches_are_near_equal_cuts_weighted_by_their_units() -> None:
    def asked_cut(rows: int, micro_batches: int | str) -> MicroCut | None:
        return ExampleBatch.of(torch.zeros(rows, 1), micro_batches).cut

    assert asked_cut(16, "auto") is None and asked_cut(3, "auto") == MicroCut(3, 1, 3)  # 3 rows: no cut of 2
    assert asked_cut(16, 4) == MicroCut(16, 4, 4) and asked_cut(16, 1) == MicroCut(16, 1, 16)
    assert asked_cut(13, 2) == MicroCut(13, 2, 7) and asked_cut(16, 5) == MicroCut(16, 5, 4)
    with pytest.raises(ValueError, match="fewer than 2 rows"):
        asked_cut(6, 4)
    with pytest.raises(ValueError, match="'auto' or a count"):
        asked_cut(6, 0)
    # counts past int64 are refused as any other count would be (pybind's TypeError before)
    with pytest.raises(ValueError, match="'auto' or a count of 1 or more, not -1000000000000000000000"):
        asked_cut(6, -10**21)
    with pytest.raises(ValueError, match="1000000000000000000000 micro-batches of a batch of 6 rows: more "):
        asked_cut(6, 10**21)
    with pytest.raises(ValueError, match="the example batch has no rows"):
        asked_cut(0, 1)
    rows = torch.arange(13).reshape(13, 1)
    assert [piece.shape[0] for piece in split(rows, 4)] == [3, 3, 3, 4]  # the fewest, near-equal
    assert [piece.shape[0] for piece in split(rows[:20], 13)] == [13]
    pieces = weighted((rows, torch.zeros(13)), MicroCut.of(13, 2), ROWS)
    assert [w for _, w in pieces] == [6 / 13, 7 / 13]
    # a count that does not divide runs as asked; a larger batch as more, none over the rows planned;
    # a smaller one as up to as many, none under 2 rows
    five = MicroCut.of(16, 5)
    assert five.bounds(16) == (0, 3, 6, 9, 12, 16) and len(five.bounds(30)) - 1 == 8 and five.bounds(6) == (0, 2, 4, 6)
    assert [piece.shape[0] for piece in split(torch.zeros(30, 2), 8)] == [7, 8, 7, 8]
    # a micro-batch whose every label is ignored adds nothing to the global mean: left out
    labels = torch.full((4, 5), -100)
    labels[2:, :3] = 1
    tokens = given_units("tokens")
    pieces = weighted({"input_ids": torch.zeros(4, 5, dtype=torch.long), "labels": labels}, MicroCut.of(4, 2), tokens)
    assert len(pieces) == 1 and pieces[0][1] == 1.0 and int((pieces[0][0]["labels"] != -100).sum()) == 6
    with pytest.raises(ValueError, match="no tokens"):
        weighted({"labels": torch.full((4, 5), -100)}, MicroCut.of(4, 2), tokens)


class Flipping(torch.nn.Module):
    """A block that runs other ops when recomputed in backward than in forward, as one that picks
    another kernel there does."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_backward = torch._C._current_graph_task_id() != -1
        y = x * 1.0 if in_backward else x
        return x + torch.nn.functional.gelu(self.linear(y))


class Appending(torch.nn.Module):
    """A block whose recompute makes tensors of other shapes: it attends over a cache its forward
    appends to, as transformers' layers with use_cache=True in training do."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(256, 256)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        cache.append(self.linear(x))
        keys = torch.cat(cache)
        return x + torch.nn.functional.gelu(torch.softmax(x @ keys.T, dim=-1) @ keys)


class FlippingNet(torch.nn.Module):
    def __init__(self, block: type[torch.nn.Module] = Flipping) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(block() for _ in range(4))
        self.head = torch.nn.Linear(256, 8)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            rows = block(rows) if isinstance(block, Flipping) else block(rows, [])
        return self.head(rows).square().mean()


@pytest.mark.parametrize(("block", "room"), [(Flipping, (46 << 20) // 10), (Appending, (91 << 20) // 10)])
def test_a_block_whose_recompute_computes_otherwise_is_found_before_training_and_not_recomputed(
        block: type[torch.nn.Module], room: int) -> None:
    from stowage.fitting.choosing import block_kind

    assert block_kind("model.layers.5") == "model.layers.*" and block_kind("0.attn") == "*.attn"
    torch.manual_seed(0)
    model, rows = FlippingNet(block), torch.randn(512, 256)
    slow_copies = {"to_host_bytes_per_ms": 1e3, "to_device_bytes_per_ms": 1e3, "prefetch_depth": 2}  # recompute wins
    gc.collect()  # earlier tests' garbage, out of the memory in use the budget is counted from
    start = stowage.memory_allocated()
    # only recomputing a block makes the step fit: refused before training, naming the block, where
    # its backward would have raised mid-training (the plans tried before it, which move with the op
    # times measured, may have been weighed again for another reason first)
    with pytest.raises(torch.OutOfMemoryError, match=r"tried before training: [^)]*blocks\.\* computes otherwise "
                                                      r"when recomputed: not recomputed"):
        stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), rows, cost=slow_copies,
                    budget=start + (16 << 20) + room, offload_optimizer=False,
                    offload_parameters=False)  # (the blocks on the host would leave room to keep it)
    # with room to offload instead, fit trains without recomputing it (from what is in use now: a
    # cache-appending block's failed recompute leaves its tensors in a cycle through autograd's
    # nodes, as it does under torch.utils.checkpoint alone)
    start = stowage.memory_allocated()
    fitted = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), rows, cost=COST,
                         budget=start + (16 << 20) + room, offload_optimizer=False)
    assert fitted.plan is None or stowage.plan.Decision.recompute not in fitted.plan.decisions
    losses = [fitted.step(rows) for _ in range(2)]
    assert all(torch.isfinite(loss) for loss in losses)


def test_fit_reads_the_example_batch_s_layout_once(monkeypatch: Any) -> None:
    """Checking the cut, recording at 2 and 3 rows and trying the choice all take the example as
    fit described it first, not its tensors read again (but once for the counts its loss may be a
    mean over)."""
    model, tokens = llama_and_batch()
    reads = []
    read = batches.tensor_leaves
    monkeypatch.setattr(batches, "tensor_leaves", lambda batch: reads.append(batch is tokens) or read(batch))
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                         loss_fn=loss_fn, cost=COST, micro_batches=2, offload_optimizer=False, verbose=False)
    assert fitted.chosen.micro_batches == 2 and fitted.units is not None
    assert reads.count(True) == 2, reads  # its layout, and the counts its loss may be a mean over
