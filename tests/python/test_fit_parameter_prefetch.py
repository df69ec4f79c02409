"""stowage.fit choosing how many blocks' parameters come in ahead where they live on the host
(Note [Parameter prefetch depth] in planner/parameter_prefetch.hpp): several where one block's long
compute can hide the slow copies of the blocks after it, one or none where the copies are fast;
the trial fit runs and the handle it hands back bring them in that far ahead."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage import _core  # noqa: E402
import stowage.fitting.choosing as choosing  # noqa: E402


pytestmark = pytest.mark.usefixtures("cpu_mode_module")

WIDTH, ROWS, WIDE_BLOCKS, REPEATS = 64, 256, 5, 20
TABLE_ROWS = 2048
ATTEMPTS = 3  # recordings whose measured compute may be compared
WIDE_BYTES = 4 * TABLE_ROWS * WIDTH
HEAVY_BYTES = 4 * (WIDTH * WIDTH + WIDTH)


class Heavy(torch.nn.Module):
    """Few parameters, long compute: one small layer applied REPEATS times."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(REPEATS):
            x = torch.tanh(self.mix(x))
        return x


class Wide(torch.nn.Module):
    """Many parameters, almost no compute: a table of which the batch's rows are added."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(TABLE_ROWS, WIDTH) * 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[0]]


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Heavy(), *(Wide() for _ in range(WIDE_BLOCKS))])
        self.head = torch.nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def loss_fn(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


def model_and_batch() -> tuple[Any, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return Stack(), (torch.randn(ROWS, WIDTH), torch.randint(0, 10, (ROWS,)))


def heavy_forward_ms(fitted: Any) -> float:
    """The heavy block's forward as fit's recorded step measured it (this machine's speed and load)."""
    trace = fitted.chosen.plan.trace
    return sum(op.duration_ms for op in trace.ops if op.phase == _core.TracePhase.forward
               and op.module.startswith("blocks.0"))


def fitted_at(monkeypatch: Any, to_device_bytes_per_ms: float) -> tuple[Any, list[int]]:
    """fit with the blocks' parameters on the host at the given copy rate; the depths the handles
    it opened were given (one: its trial's, kept for training)."""
    asked: list[int] = []

    def spy(model: Any, units: Any = None, prefetch: int = 1) -> Any:
        asked.append(prefetch)
        return stowage.offload.parameters(model, units, prefetch)

    monkeypatch.setattr(choosing, "offloaded_parameters", spy)
    warm, batch = model_and_batch()  # the process's first steps run cold (its threads, its pages): not fit's
    for _ in range(2):
        loss_fn(warm, batch).backward()
    del warm
    model, batch = model_and_batch()
    cost = {"to_host_bytes_per_ms": to_device_bytes_per_ms, "to_device_bytes_per_ms": to_device_bytes_per_ms,
            "prefetch_depth": 2}
    fitted = stowage.fit(model, lambda params: torch.optim.SGD(params, lr=0.1), batch, loss_fn=loss_fn, cost=cost,
                         offload_parameters=True, verbose=False)
    return fitted, asked


def test_slow_copies_behind_a_long_block_come_in_several_blocks_ahead(monkeypatch: Any) -> None:
    # A wide block's copy takes a sixth of the heavy block's forward, far longer than a wide block
    # runs: one block ahead, the copies of the wide blocks after the heavy one wait in turn;
    # deeper, they come in while it runs. The heavy block's time is what a fit measures, which a
    # busy host can stretch or shrink between two recordings: the copy rate is set from the last
    # recording, and the premise (a copy between a twelfth and a half of the heavy block's forward
    # as the fit that chose measured it) is checked before its choice is.
    measured, _ = fitted_at(monkeypatch, WIDE_BYTES * 1e4)
    heavy_ms = heavy_forward_ms(measured)
    measured.close()
    for _ in range(ATTEMPTS):
        copy_ms = heavy_ms / 6
        fitted, asked = fitted_at(monkeypatch, WIDE_BYTES / copy_ms)
        heavy_ms = heavy_forward_ms(fitted)
        if heavy_ms / 12 <= copy_ms <= heavy_ms / 2:
            break
        fitted.close()
    else:
        pytest.skip(f"the heavy block's measured forward moved more than 2x between {ATTEMPTS + 1} recordings "
                    "(a busy host): no premise to check the depth against")
    depth = fitted.chosen.parameter_prefetch
    assert fitted.parameters_on_host and depth > 1, str(fitted)
    assert f"brought in {depth} blocks ahead of its use" in str(fitted)
    assert asked == [depth]  # the trial's handle, the one fit hands back
    x, y = torch.randn(ROWS, WIDTH), torch.randint(0, 10, (ROWS,))
    fitted.step((x, y))
    sizes = [HEAVY_BYTES] + [WIDE_BYTES] * WIDE_BLOCKS  # the schedule holds the running block and `depth` more
    held = max(sum(sizes[start:start + depth + 1]) for start in range(len(sizes)))
    assert fitted.offloaded_parameters.peak_resident_bytes == held
    fitted.close()


def test_fast_copies_come_in_one_block_ahead_or_as_each_block_runs(monkeypatch: Any) -> None:
    fitted, asked = fitted_at(monkeypatch, WIDE_BYTES * 1e4)  # a wide block's copy in 0.1 us: nothing to hide
    depth = fitted.chosen.parameter_prefetch
    assert fitted.parameters_on_host and depth <= 1, str(fitted)
    assert asked == [depth]
    fitted.close()
