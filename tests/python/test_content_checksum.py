"""Content checksums (python/tensors/content_checksum.hpp): the host loop gives the
documented sums, equal bytes give equal rows whatever the layout, and the changes training code
makes (one bit, one element, a swap within a row or a column, a permutation) change them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stowage.serving import torch_module  # noqa: E402


def checksums(*tensors: torch.Tensor) -> torch.Tensor:
    return torch_module().content_checksums(list(tensors))


def documented(tensor: torch.Tensor) -> torch.Tensor:
    """The header's definition, in plain torch: 32-bit words in rows of 1024, wrapping sums."""
    words = tensor.detach().contiguous().view(-1).view(torch.int32)
    rows = words.numel() // 1024
    grid, tail = words[:rows * 1024].view(rows, 1024).to(torch.int64), words[rows * 1024:].to(torch.int64)

    def wrap32(x: torch.Tensor) -> torch.Tensor:
        return (x + 2 ** 31) % 2 ** 32 - 2 ** 31

    row_sums, column_sums = wrap32(grid.sum(1)), wrap32(grid.sum(0))
    total = row_sums.sum() + tail.sum()
    by_row = (row_sums * torch.arange(1, rows + 1)).sum() + (tail * torch.arange(rows + 1, rows + 1 + len(tail))).sum()
    by_column = (column_sums * torch.arange(1, 1025)).sum() * (rows > 0) + (tail * torch.arange(1, len(tail) + 1)).sum()
    return torch.stack([total, by_row, by_column])


@pytest.mark.parametrize("shape", [(7,), (1024,), (3000, 7), (4096, 1025)])
def test_the_host_loop_gives_the_documented_sums(shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape)
    assert torch.equal(checksums(x)[0], documented(x))


def test_equal_bytes_give_equal_checksums_whatever_the_layout() -> None:
    x = torch.randn(300, 500)
    assert torch.equal(checksums(x), checksums(x.clone()))
    assert torch.equal(checksums(x.t().contiguous().t()), checksums(x))  # a strided copy of the same values
    b = torch.randn(1001).bfloat16()
    assert torch.equal(checksums(b[1:])[0], checksums(b[1:].clone())[0])  # odd length, unaligned start


def swap(x: torch.Tensor, i: int, j: int) -> None:
    flat = x.view(-1)
    flat[[i, j]] = flat[[j, i]].clone()


CHANGES = {
    "one bit": lambda x: x.view(-1).view(torch.int32)[12345].bitwise_xor_(1),
    "one element by an ulp": lambda x: x.view(-1)[777].copy_(torch.nextafter(x.view(-1)[777], torch.tensor(9.0))),
    "a swap within a row": lambda x: swap(x, 10, 11),
    "a swap within a column": lambda x: swap(x, 5, 5 + 1024),
    "a permutation": lambda x: x.copy_(x.flip(0)),
    "a clamp": lambda x: x.clamp_(-0.5, 0.5),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_changes_training_code_makes_change_the_checksum(change: str) -> None:
    x = torch.randn(4096, 1024)
    before = checksums(x)
    CHANGES[change](x)
    assert not torch.equal(checksums(x), before)
