"""stowage.fit never guesses how a loss is weighted: a cut is kept only where the example batch's own
losses verify it (Note [Micro-batches]). Each case is held to plain torch on the whole batch: the
gradient of ``fitted.backward(batch)`` as micro-batches equals torch's of the whole batch's loss,
or fit refuses the cut, naming why."""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.plan  # noqa: E402
from stowage.fitting.batches import BatchLayout  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}


def gradients(model: Any) -> torch.Tensor:
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return grads


def whole_batch_gradient(model: Any, batch: Any, loss_fn: Any) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()
    return gradients(model)


def fitted_gradient(model: Any, batch: Any, loss_fn: Any, **options: Any) -> tuple[Any, torch.Tensor]:
    fitted = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, loss_fn=loss_fn,
                         verbose=False, cost=COST, **options)
    fitted.backward(batch)
    return fitted, gradients(model)


def off_by(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm())


def classifier() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def rows_and_labels() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(16, 16, generator=generator), torch.randint(0, 4, (16,), generator=generator)


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(64, 32), nn.Linear(32, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(ids)))


def padded_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and their labels, the first rows full and the later ones padded (-100), as a
    length-sorted collator makes them: a probe of the first rows sees no padding."""
    ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    for row in range(4, 8):
        labels[row, 12 - 2 * row + 4:] = -100
    return ids, labels


def token_mean(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())  # a mean over the labels not -100


def _ignored_rows() -> tuple[Any, Any, Any]:
    rows, labels = rows_and_labels()
    labels[10:] = -100  # padded rows, ignored by the loss
    return classifier(), (rows, labels), lambda m, b: F.cross_entropy(m(b[0]), b[1])


def _weighted_rows() -> tuple[Any, Any, Any]:
    rows, labels = rows_and_labels()
    weights = torch.rand(16, generator=torch.Generator().manual_seed(3))
    weights[:4] = 1.0

    def loss(m: Any, b: Any) -> torch.Tensor:
        return (F.cross_entropy(m(b[0]), b[1], reduction="none") * b[2]).sum() / b[2].sum()

    return classifier(), (rows, labels, weights), loss


def _masked_rows() -> tuple[Any, Any, Any]:
    rows, labels = rows_and_labels()
    mask = torch.rand(16, generator=torch.Generator().manual_seed(4)) < 0.5
    mask[:4] = True
    return classifier(), (rows, labels, mask), lambda m, b: F.cross_entropy(m(b[0])[b[2]], b[1][b[2]])


def _tuple_tokens() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    return Tokens(), padded_tokens(), lambda m, b: token_mean(m(b[0]), b[1])


def _target_key() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    ids, labels = padded_tokens()
    return Tokens(), {"ids": ids, "target": labels}, lambda m, b: token_mean(m(b["ids"]), b["target"])


CASES = {"ignored rows": _ignored_rows, "per-row weights": _weighted_rows, "masked rows": _masked_rows,
         "tuple token mean": _tuple_tokens, "token mean under 'target'": _target_key}


@pytest.mark.parametrize("case", list(CASES))
def test_a_cut_is_weighted_by_what_the_loss_averages_giving_the_whole_batch_s_gradient(case: str) -> None:
    model, batch, loss_fn = CASES[case]()
    expected = whole_batch_gradient(model, batch, loss_fn)
    fitted, got = fitted_gradient(model, batch, loss_fn, micro_batches=2)
    assert fitted.chosen.micro_batches == 2
    assert off_by(got, expected) < 1e-5, (case, fitted.units.name)
    assert fitted.units.name != "rows"  # none of these is a mean over rows


def test_a_bert_classifier_ignoring_padded_rows_is_weighted_by_its_labelled_rows() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                     vocab_size=256, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(config)  # dropout on: the check must not see it
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (8, 16), generator=generator)
    labels = torch.randint(0, 3, (8,), generator=generator)
    labels[5:] = -100  # padded rows of the last batch of an epoch
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    fitted = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, verbose=False, cost=COST,
                         micro_batches=2)
    assert fitted.units is not None and fitted.units.name == "entries of batch['labels'] not -100"
    model.eval()  # the gradients compared without dropout's noise
    expected = whole_batch_gradient(model, batch, lambda m, b: m(**b).loss)
    fitted.backward(batch)
    assert off_by(gradients(model), expected) < 1e-5


def test_micro_batches_auto_cuts_a_token_mean_by_its_tokens() -> None:
    """fit chooses a cut on its own (the whole batch does not fit) and weighs it by the tokens the
    loss averages: the gradient is the whole batch's (by rows it was 1.38x its norm)."""
    from stowage.models.llama import Llama, LlamaShape

    shape = LlamaShape(hidden=128, layers=3, heads=4, kv_heads=2, vocab=512, max_sequence=96)
    ids = torch.randint(0, 512, (8, 96), generator=torch.Generator().manual_seed(6))
    labels = ids.clone()
    for row in range(4, 8):  # the later rows padded: a probe of the first rows sees none
        labels[row, 96 - 20 * (row - 3):] = -100

    def loss_fn(model: Any, batch: Any) -> torch.Tensor:
        return token_mean(model.head(model.hidden_states(batch[0])).float(), batch[1])

    torch.manual_seed(0)
    whole, half = lowest_peaks(Llama(shape), (ids, labels), loss_fn)
    gc.collect()
    torch.manual_seed(0)
    model = Llama(shape)
    expected = whole_batch_gradient(model, (ids, labels), loss_fn)
    trainable = sum(p.numel() * 4 for p in model.parameters())
    assert half + trainable < whole
    budget = stowage.memory_allocated() + 2 * trainable + (half + trainable + whole) // 2 + (16 << 20)
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params), (ids, labels), loss_fn=loss_fn,
                         budget=budget, cost=COST, micro_batches="auto", offload_optimizer=False, verbose=False)
    assert fitted.chosen.micro_batches >= 2
    fitted.backward((ids, labels))
    assert off_by(gradients(model), expected) < 1e-4
    assert fitted.units.name == "entries of batch[1] not -100"
    # the cut fit chose is itself checked: a loss that holds at the finest cut and not at the one
    # chosen keeps the batch whole, which does not fit here, saying why
    rows_chosen = fitted.chosen.micro_rows

    def scaled_at_the_chosen_rows(model: Any, batch: Any) -> torch.Tensor:
        return loss_fn(model, batch) * (1.01 if batch[0].shape[0] == rows_chosen else 1.0)

    with pytest.raises(torch.OutOfMemoryError, match=r"the batch runs whole: the loss of the whole batch "
                                                      r"\(.*\) is not its micro-batches' weighted by rows"):
        stowage.fit(model, lambda params: torch.optim.AdamW(params), (ids, labels), loss_fn=scaled_at_the_chosen_rows,
                    budget=budget, cost=COST, micro_batches="auto", offload_optimizer=False, verbose=False,
                    offload_parameters=False)  # (the blocks on the host would let it run whole)


def lowest_peaks(model: Any, batch: Any, loss_fn: Any) -> tuple[int, int]:
    """The lowest planned peak of the step on the whole batch and on half of it, as fit profiles them."""
    def step(**sizes: int) -> None:
        loss_fn(model, BatchLayout.of(batch).at(batch, sizes)).backward()
        model.zero_grad(set_to_none=True)

    sized = stowage.plan.profile(step, sizes={"batch": (2, 3)}, cost=COST, model=model)
    rows = BatchLayout.of(batch).rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole, half = (stowage.plan.solve(sized.at({"batch": r}), 1).predicted_peak_bytes for r in (rows, rows // 2))
    return whole, half


def test_a_right_padded_first_row_does_not_stop_a_cut() -> None:
    torch.manual_seed(0)
    model, (ids, labels) = Tokens(), padded_tokens()
    labels[0, 2:] = -100  # the first row mostly padding
    loss_fn = lambda m, b: token_mean(m(b[0]), b[1])  # noqa: E731
    expected = whole_batch_gradient(model, (ids, labels), loss_fn)
    fitted, got = fitted_gradient(model, (ids, labels), loss_fn, micro_batches=2)
    assert fitted.chosen.micro_batches == 2 and off_by(got, expected) < 1e-5


class FunctionalNorm(nn.Module):
    """A batch norm written with F.batch_norm in a module of the user's (no BatchNorm module)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 32)
        self.register_buffer("mean", torch.zeros(32))
        self.register_buffer("var", torch.ones(32))
        self.head = nn.Linear(32, 4)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        hidden = F.batch_norm(self.linear(rows), self.mean, self.var, training=self.training)
        return self.head(torch.relu(hidden))


def test_a_functional_batch_norm_keeps_the_batch_whole_naming_the_op_and_module(capsys: Any) -> None:
    torch.manual_seed(0)
    model, batch = FunctionalNorm(), rows_and_labels()
    loss_fn = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    with pytest.raises(ValueError, match=r"aten\.native_batch_norm in the model's own forward computes statistics "
                                         r"over the rows.*split_batchnorm=True"):
        stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, loss_fn=loss_fn, micro_batches=2,
                    verbose=False, cost=COST)
    fitted = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, loss_fn=loss_fn,
                         micro_batches="auto", cost=COST)
    assert fitted.chosen.micro_batches == 1 and "not cut: aten.native_batch_norm" in capsys.readouterr().out
    allowed = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, loss_fn=loss_fn,
                          micro_batches=2, split_batchnorm=True, verbose=False, cost=COST)
    assert allowed.chosen.micro_batches == 2 and allowed.units.name == "rows"
    assert torch.equal(model.mean, torch.zeros(32))  # the check ran on the running statistics, left as they were


def test_a_count_that_does_not_divide_the_rows_runs_as_asked_weighted_by_rows() -> None:
    model, batch, loss_fn = classifier(), rows_and_labels(), lambda m, b: F.cross_entropy(m(b[0]), b[1])
    expected = whole_batch_gradient(model, batch, loss_fn)
    fitted, got = fitted_gradient(model, batch, loss_fn, micro_batches=5)
    assert fitted.chosen.micro_batches == 5
    assert [piece[0].shape[0] for piece, _ in fitted.micro_batches(batch)] == [3, 3, 3, 3, 4]
    assert [w for _, w in fitted.micro_batches(batch)] == [3 / 16] * 4 + [4 / 16]
    assert off_by(got, expected) < 1e-5


def test_rows_are_read_from_every_tensor_a_leading_one_shared_by_every_row() -> None:
    from stowage._core import MicroCut

    ids = torch.zeros(4, 10, dtype=torch.long)
    batch = {"position_ids": torch.arange(10)[None], "input_ids": ids, "labels": ids}
    layout = BatchLayout.of(batch)
    assert layout.sizes == {"batch": 4, "seq": 10}
    pieces = layout.pieces(batch, MicroCut.of(4, 2).bounds(4))  # the shared tensor goes whole with every micro-batch
    assert [(p["position_ids"].shape[0], p["input_ids"].shape[0]) for p in pieces] == [(1, 2), (1, 2)]
    with pytest.raises(ValueError, match=r"disagree on its rows.*batch\['a'\] has 4, batch\['b'\] has 3"):
        BatchLayout.of({"a": torch.zeros(4, 2), "b": torch.zeros(3, 2)})
    assert BatchLayout.of(torch.zeros(1, 5, dtype=torch.long)).sizes == {"batch": 1, "seq": 5}


def test_a_bf16_step_is_checked_within_its_measured_rounding_telling_shifted_tokens_from_tokens() -> None:
    """Under bf16 autocast, or with bf16 parameters, the cut is still told apart from the counts
    one token off per row (rounding measured on the step, not taken as bf16's)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32)
    ids = torch.randint(0, 256, (16, 24), generator=torch.Generator().manual_seed(7))
    labels = ids.clone()
    for row in range(16):
        labels[row, 24 - row:] = -100
    batch = {"input_ids": ids, "labels": labels}

    def autocast_loss(model: Any, b: Any) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(**b).loss

    for bf16_parameters in (False, True):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        if bf16_parameters:
            model = model.to(torch.bfloat16)
        fitted = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, verbose=False, cost=COST,
                             micro_batches=4, loss_fn=None if bf16_parameters else autocast_loss)
        assert fitted.units.name == "entries of batch['labels'][:, 1:] not -100", bf16_parameters


def test_counts_the_example_cannot_tell_apart_keep_the_batch_whole_or_refuse_a_later_batch_they_weigh_apart() -> None:
    loss_fn = lambda m, b: token_mean(m(b[0]), b[1])  # noqa: E731
    torch.manual_seed(0)
    flat = Tokens()
    nn.init.zeros_(flat.head.weight)
    nn.init.zeros_(flat.head.bias)  # every token costs log(64): any weighting adds up to the whole's loss
    with pytest.raises(ValueError, match=r"cannot tell whether the loss is a mean over rows or over entries of "
                                         r"batch\[1\] not -100.*loss_units="):
        stowage.fit(flat, lambda params: torch.optim.SGD(params, lr=0.1), padded_tokens(), loss_fn=loss_fn,
                    micro_batches=2, verbose=False, cost=COST)
    # an example without padding weighs every cut alike by rows and by tokens: both kept, and a
    # later batch they weigh differently is refused before anything runs
    torch.manual_seed(0)
    model, (ids, labels) = Tokens(), padded_tokens()
    fitted = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), (ids, ids.clone()), loss_fn=loss_fn,
                         micro_batches=2, verbose=False, cost=COST)
    assert fitted.units.name == "rows" and "entries of batch[1] not -100" in [u.name for u in fitted.units.alike]
    assert [w for _, w in fitted.micro_batches((ids, ids))] == [0.5, 0.5]
    with pytest.raises(ValueError, match=r"weigh 0\.500/0\.500 by rows and 0\.[0-9]+/0\.[0-9]+ by entries of "
                                         r"batch\[1\] not -100.*loss_units="):
        fitted.backward((ids, labels))
    assert all(p.grad is None for p in model.parameters())


def test_a_step_drawing_random_numbers_other_than_dropout_keeps_the_batch_whole_naming_them() -> None:
    model, batch = classifier(), rows_and_labels()

    def noisy(m: Any, b: Any) -> torch.Tensor:
        return F.cross_entropy(m(b[0] + torch.randn_like(b[0])), b[1])

    state = torch.get_rng_state()
    with pytest.raises(ValueError, match=r"not its micro-batches' weighted by rows.*draws random numbers "
                                         r"\(aten\.\w+\) that a cut draws differently"):
        stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, loss_fn=noisy, micro_batches=2,
                    verbose=False, cost=COST)
    assert torch.equal(torch.get_rng_state(), state)  # each of the check's forwards put the generator back


def test_where_the_whole_batch_s_forward_runs_out_of_memory_the_cut_is_checked_in_spans() -> None:
    from stowage.fitting.cut_check import CutCheck
    from stowage._core import MicroCut
    from stowage.fitting.batches import ExampleBatch

    model, batch = classifier(), rows_and_labels()

    def fits(most: int) -> Any:
        def loss(m: Any, b: Any) -> torch.Tensor:
            if b[0].shape[0] > most:
                raise torch.OutOfMemoryError(f"{b[0].shape[0]} rows do not fit")
            return F.cross_entropy(m(b[0]), b[1])
        return loss

    verdict = CutCheck(model, fits(8), ExampleBatch.of(batch, "auto"), torch.device("cpu"), False).verify([MicroCut.of(16, 8)])
    assert verdict.units is not None and verdict.units.name == "rows"
    assert "in spans of consecutive ones (the whole batch's forward does not fit" in verdict.checked
    unweighted = CutCheck(model, fits(8), ExampleBatch.of((batch[0], batch[1], torch.arange(16.0)), "auto"),
                          torch.device("cpu"), False)
    assert unweighted.verify([MicroCut.of(16, 8)]).units.name == "rows"  # the weights are no part of the loss here
    refused = CutCheck(model, fits(3), ExampleBatch.of(batch, "auto"), torch.device("cpu"), False).verify([MicroCut.of(16, 8)])
    assert refused.units is None and "nor does one of two micro-batches together" in refused.not_cut
    too_large = CutCheck(model, fits(3), ExampleBatch.of(batch, "auto"), torch.device("cpu"), False).verify([MicroCut.of(16, 4)])
    assert too_large.units is None and "a micro-batch of 4 rows does not fit in a forward of its own" in too_large.not_cut


def test_loss_units_given_are_taken_unchecked_but_a_step_mixing_rows_is_still_refused() -> None:
    model, batch = classifier(), rows_and_labels()
    told = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, micro_batches=2, verbose=False,
                       loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="sum"), loss_units="rows",
                       cost=COST)
    assert told.units.name == "rows" and told.example.checked == "loss_units as given"
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="native_batch_norm in the model's own forward computes statistics"):
        stowage.fit(FunctionalNorm(), lambda params: torch.optim.SGD(params, lr=0.1), batch, micro_batches=2,
                    verbose=False, loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]), loss_units="rows", cost=COST)
