"""The inspector's advice (stowage.advice): each rule fires on a loop that shows its waste, not
on one that does not, and the saving it predicts (the peak re-simulated without the waste) is
within 15% of what applying the advice and running the loop again saves (for activations, an
upper bound of it)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.inspector import inspect_device  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def model(width: int = 256, layers: int = 4) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                 for _ in range(layers)), torch.nn.Linear(width, 4))


def loop(net: Any, optimizer: Any, rows: Any, steps: int = 3, set_to_none: bool = True,
         context: Callable[[], Any] | None = None, kept: list[Any] | None = None, detach: bool = False) -> None:
    for _ in range(steps):
        with (context() if context is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)):
            net(rows).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
        if kept is not None:
            kept.append(net(rows[:64]).detach() if detach else net(rows[:64]))
        stowage.mark_step()


def inspected(run: Callable[[], None]) -> tuple[dict[str, Any], int]:
    """The report of `run`'s trace, and its measured peak (bytes the run added)."""
    import gc

    gc.collect()
    start = stowage.memory_allocated()
    stowage.reset_peak_stats()
    stowage.record_history(True)
    try:
        run()
        snapshot = stowage.snapshot()
    finally:
        stowage.record_history(False)
    return inspect_device(snapshot, 0, 5), stowage.max_memory_allocated() - start


def rules(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["rule"]: row for row in report["advice"]}


def test_optimizer_states_at_the_peak_are_advised_to_the_host_and_the_saving_holds() -> None:
    rows = torch.randn(64, 1024)
    net = model(1024, 4)  # states large beside the activations
    report, peak = inspected(lambda: loop(net, torch.optim.AdamW(net.parameters()), rows))
    advice = rules(report)["optimizer states"]
    assert "stowage.offload.AdamW" in advice["advice"]
    # a plain training loop wastes nothing else
    assert set(rules(report)) <= {"optimizer states", "activations"}, rules(report)
    net = model(1024, 4)
    offloaded = stowage.offload.AdamW(net.parameters())
    _, lower = inspected(lambda: loop(net, offloaded, rows))
    offloaded.close()
    assert abs((peak - lower) - advice["saving_bytes"]) <= 0.15 * advice["saving_bytes"]


def checkpointed(net: Any) -> Any:
    """Each block (each item of the outer Sequential with modules inside: not the head) recomputed
    in backward."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint

    for block in list(net)[:-1]:
        block.forward = partial(checkpoint, block.forward, use_reentrant=False)
    return net


def test_activations_at_the_peak_are_advised_to_be_recomputed_and_the_saving_holds() -> None:
    rows = torch.randn(4096, 256)
    net = model(256, 6)  # activations large beside the states
    report, peak = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows))
    advice = rules(report)["activations"]
    assert "torch.utils.checkpoint" in advice["advice"] and "optimizer states" not in rules(report)
    assert "6 blocks checkpointed, e.g. Sequential.0" in advice["advice"] and not advice["upper_bound"]
    net = checkpointed(model(256, 6))
    _, lower = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows))
    assert abs((peak - lower) - advice["saving_bytes"]) <= 0.15 * advice["saving_bytes"]


def test_without_module_paths_the_activations_saving_is_a_bound() -> None:
    rows = torch.randn(4096, 256)
    net = model(256, 6)
    stowage.record_history(True)
    try:
        loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows)
        snapshot = stowage.snapshot()
    finally:
        stowage.record_history(False)
    tagged = rules(inspect_device(snapshot, 0, 5))["activations"]
    snapshot.pop("stowage_tags")  # as stock torch writes it
    stock = rules(inspect_device(snapshot, 0, 5))["activations"]
    assert stock["upper_bound"] and stock["saving_bytes"] >= tagged["saving_bytes"]


def test_a_forward_without_backward_that_keeps_its_graph_is_advised_no_grad() -> None:
    rows = torch.randn(1024, 256)

    def evaluate(net: Any, grad: bool) -> None:
        outputs = None
        for _ in range(3):
            with torch.enable_grad() if grad else torch.no_grad():
                outputs = net(rows).square().mean()  # kept until the next one
        del outputs

    net = model(256, 6)
    report, peak = inspected(lambda: (loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows[:64], steps=1),
                                      evaluate(net, True)))
    advice = rules(report)["forward without backward"]
    assert "torch.no_grad()" in advice["advice"]
    net = model(256, 6)
    report, lower = inspected(lambda: (loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows[:64], steps=1),
                                       evaluate(net, False)))
    assert "forward without backward" not in rules(report)
    assert abs((peak - lower) - advice["saving_bytes"]) <= 0.15 * advice["saving_bytes"]


def test_gradients_kept_across_steps_are_named_with_the_fix_and_the_saving_holds() -> None:
    rows = torch.randn(64, 1024)
    net = model(1024, 4)
    report, peak = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows, set_to_none=False))
    advice = rules(report)["gradients kept across steps"]
    assert "set_to_none=True" in advice["advice"]
    net = model(1024, 4)
    report, lower = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows))
    assert "gradients kept across steps" not in rules(report)
    assert abs((peak - lower) - advice["saving_bytes"]) <= 0.15 * advice["saving_bytes"]


def test_memory_growing_every_step_is_named_by_its_site() -> None:
    rows = torch.randn(512, 256)
    net, kept = model(), []
    report, peak = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows, steps=6, kept=kept))
    advice = rules(report)["memory growing every step"]
    assert "test_inspect_advice.py" in advice["advice"] and ".item()" in advice["advice"]
    net, kept = model(), []
    _, lower = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows, steps=6, kept=kept,
                                      detach=True))
    assert abs((peak - lower) - advice["saving_bytes"]) <= 0.15 * advice["saving_bytes"]
    net = model()
    report, _ = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows, steps=6))
    assert "memory growing every step" not in rules(report)


def test_the_html_report_opens_with_the_advice() -> None:
    from stowage.html_report import render

    rows = torch.randn(64, 1024)
    net = model(1024, 4)
    stowage.record_history(True)
    try:
        loop(net, torch.optim.AdamW(net.parameters()), rows)
        snapshot = stowage.snapshot()
    finally:
        stowage.record_history(False)
    html = render("loop", inspect_device(snapshot, 0, 5), snapshot)
    assert html.index("<h2>Advice</h2>") < html.index("Live memory by allocation site")
    assert "stowage.offload.AdamW" in html


class TinyLM(torch.nn.Module):
    """A vocabulary far wider than the model: its logits dominate the step."""

    def __init__(self, vocab: int = 8192, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.body, self.head = (torch.nn.Embedding(vocab, width), torch.nn.Linear(width, width),
                                            torch.nn.Linear(width, vocab))

    def hidden(self, tokens: Any) -> Any:
        return torch.tanh(self.body(self.embed(tokens)))

    def forward(self, tokens: Any) -> Any:
        return self.head(self.hidden(tokens))


def lm_loop(net: TinyLM, chunks: int = 0, steps: int = 2) -> None:
    from torch.utils.checkpoint import checkpoint

    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    tokens = torch.randint(0, 8192, (4, 257), generator=torch.Generator().manual_seed(0))
    inputs, labels = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    for _ in range(steps):
        if chunks:
            hidden = net.hidden(inputs).reshape(labels.numel(), -1)
            loss = sum(checkpoint(lambda h, y: torch.nn.functional.cross_entropy(net.head(h), y, reduction="sum"),
                                  h, y, use_reentrant=False)
                       for h, y in zip(hidden.chunk(chunks), labels.chunk(chunks))) / labels.numel()
        else:
            loss = torch.nn.functional.cross_entropy(net(inputs).reshape(labels.numel(), -1), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        stowage.mark_step()


def test_logits_at_the_peak_are_advised_a_chunked_loss_and_the_saving_holds() -> None:
    from stowage.advice import LOSS_CHUNKS

    report, peak = inspected(lambda: lm_loop(TinyLM()))
    advice = rules(report)["logits at the peak"]
    assert f"{LOSS_CHUNKS} chunks" in advice["advice"]
    report, lower = inspected(lambda: lm_loop(TinyLM(), chunks=LOSS_CHUNKS))
    after = rules(report).get("logits at the peak")  # a chunk's logits may still be a tenth of the (lower) peak
    assert after is None or after["waste_bytes"] <= advice["waste_bytes"] // 2
    assert abs((peak - lower) - advice["saving_bytes"]) <= 0.15 * advice["saving_bytes"]
    rows = torch.randn(4096, 256)  # a classifier's loss: small logits
    net = model(256, 6)
    report, _ = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows))
    assert "logits at the peak" not in rules(report)


def test_inputs_at_the_peak_are_advised_micro_batches() -> None:
    net = torch.nn.Linear(2048, 1)

    def run() -> None:
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            wide = torch.randn(8192, 2048)  # each step's batch, far larger than the model that reads it
            net(wide).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            stowage.mark_step()

    report, _ = inspected(run)
    advice = rules(report)["inputs"]
    assert 'micro_batches="auto"' in advice["advice"] and advice["waste_bytes"] >= 8192 * 2048 * 4
    rows = torch.randn(64, 1024)
    net = model(1024, 4)
    report, _ = inspected(lambda: loop(net, torch.optim.SGD(net.parameters(), lr=0.1), rows))
    assert "inputs" not in rules(report)


def oom_snapshot(free_in_pieces: int) -> dict[str, Any]:
    """A device of 1 GiB: 100 MiB live, `free_in_pieces` cached free in 4 MiB blocks, and an OOM
    asking for 64 MiB with 32 MiB free on the device."""
    base, blocks = 1 << 32, [{"address": 1 << 32, "size": 100 << 20, "requested_size": 100 << 20,
                              "state": "active_allocated"}]
    for k in range(free_in_pieces >> 22):
        blocks.append({"address": base + (100 << 20) + (k << 22), "size": 4 << 20, "state": "inactive"})
    segment = {"device": 0, "address": base, "total_size": sum(b["size"] for b in blocks), "blocks": blocks}
    trace = [{"action": "alloc", "addr": base, "size": 100 << 20, "stream": 0},
             {"action": "oom", "size": 64 << 20, "device_free": 32 << 20, "stream": 0}]
    return {"segments": [segment], "device_traces": [trace]}


FREE_IN_PIECES = "out of memory with the bytes free in pieces"

# allocator_settings as torch 2.11 writes them: its own allocator's (stock) ...
STOCK_SETTINGS = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                  "expandable_segments": False, "pinned_num_register_threads": 1,
                  "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False}
# ... and stowage's CUDA allocator's: torch's keys, the settings string stowage's configuration
# (python/libtorch/cuda_allocator.cpp's config_metadata)
STOWAGE_CUDA_SETTINGS = dict(STOCK_SETTINGS, PYTORCH_CUDA_ALLOC_CONF="stowage:reserve_headroom:0.05", max_split_size=0)


def test_an_oom_with_the_bytes_free_in_pieces_is_advised_stowage_s_allocator() -> None:
    advice = rules(inspect_device(oom_snapshot(96 << 20), 0, 5))[FREE_IN_PIECES]
    assert "stowage's allocator" in advice["advice"] and advice["saving_bytes"] == 32 << 20
    assert FREE_IN_PIECES not in rules(inspect_device(oom_snapshot(0), 0, 5))
    stock = dict(oom_snapshot(96 << 20), allocator_settings=STOCK_SETTINGS)
    assert FREE_IN_PIECES in rules(inspect_device(stock, 0, 5))


def test_a_snapshot_stowage_s_cuda_allocator_recorded_is_not_advised_stowage_s_allocator() -> None:
    under_stowage = dict(oom_snapshot(96 << 20), allocator_settings=STOWAGE_CUDA_SETTINGS)
    report = inspect_device(under_stowage, 0, 5)
    assert FREE_IN_PIECES not in rules(report) and report["ooms"][0]["under_stowage"]


def test_a_snapshot_stowage_s_cpu_mode_wrote_is_not_advised_stowage_s_allocator() -> None:
    """A real OOM under CPU mode with half the device cached free in 1 MiB pieces: the snapshot
    stowage writes gets no advice to use stowage's allocator; the same trace unmarked does."""
    import gc

    gc.collect()
    kept: list[Any] = []
    stowage.record_history(True)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            while True:  # the device filled with small blocks
                kept.append(torch.empty(1 << 20, dtype=torch.uint8))
        del kept[::2]  # half of it free, in pieces no 64 MiB request fits
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(64 << 20, dtype=torch.uint8)
        written = stowage.snapshot()
    finally:
        stowage.record_history(False)
        kept.clear()
        stowage.empty_cache()
    assert written["allocator_settings"]["allocator"] == "stowage"
    report = inspect_device(written, 0, 5)
    assert report["ooms"] and FREE_IN_PIECES not in rules(report)
    assert report["ooms"][0]["under_stowage"]
    unmarked = {key: value for key, value in written.items() if key != "allocator_settings"}
    assert FREE_IN_PIECES in rules(inspect_device(unmarked, 0, 5))
