"""The device a session's runs are on: "cpu" (CPU mode: stowage as torch's CPU allocator over a
simulated device, switched off for the allocator cell's reference) or "cuda" (a GPU: stowage is
torch's CUDA allocator for the whole process, enabled before CUDA starts, and stays so).

Contract: ``session(device)`` wraps all of a session's cells. On the CPU it runs torch on one
thread (the cells' ops are small; on a shared 2-core machine a second thread costs more than it
gives). On a GPU it makes every run reproducible bit for bit: torch's deterministic algorithms
(an op without a deterministic CUDA kernel raises, naming itself), cuBLAS with a fixed workspace
per stream (CUBLAS_WORKSPACE_CONFIG, read when cuBLAS first runs: set it before, as
tests/gpu/run.sh does), cuDNN's deterministic algorithms and no benchmarking; cuBLAS's workspaces
are made before the first cell, so no profile or fit budget counts them. Everything is as it was
after it. ``rng_states(device)`` are the global generators a run draws from (the CPU's, and the
GPU's on a GPU); ``set_rng_states`` puts them back.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

CUBLAS_VARIABLE = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE = ":4096:8"
DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")  # the settings torch's deterministic mode accepts


def placed(device: str) -> torch.device:
    """The torch.device a model moved to `device` ends up on ("cuda": the current GPU's index),
    as ``p.device`` names it (the key stowage.fit measures its update rates under)."""
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def rng_states(device: str) -> dict[str, torch.Tensor]:
    """The global generators' states (CPU tensors): the CPU's, and on a GPU the GPU's."""
    states = {"torch.get_rng_state()": torch.get_rng_state()}
    if device == "cuda":
        states["torch.cuda.get_rng_state()"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: dict[str, torch.Tensor]) -> None:
    """Puts back what ``rng_states`` returned."""
    torch.set_rng_state(states["torch.get_rng_state()"])
    if "torch.cuda.get_rng_state()" in states:
        torch.cuda.set_rng_state(states["torch.cuda.get_rng_state()"])


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _warm_cublas() -> None:
    """cuBLAS's handle and workspaces (a plain product's, and cuBLASLt's for a product with a
    bias), made once per stream and kept: made here, they are in use before any cell measures."""
    a = torch.ones(16, 16, device="cuda")
    torch.nn.functional.linear(a, a, torch.ones(16, device="cuda"))
    torch.mm(a, a)
    torch.cuda.synchronize()


@contextlib.contextmanager
def _deterministic_cuda() -> Iterator[None]:
    os.environ.setdefault(CUBLAS_VARIABLE, CUBLAS_WORKSPACE)
    if os.environ[CUBLAS_VARIABLE] not in DETERMINISTIC_CUBLAS:
        raise RuntimeError(f"{CUBLAS_VARIABLE}={os.environ[CUBLAS_VARIABLE]!r}: cuBLAS is deterministic only with "
                           f"{' or '.join(DETERMINISTIC_CUBLAS)} (set it before the process first runs cuBLAS)")
    cudnn = torch.backends.cudnn
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             cudnn.benchmark, cudnn.deterministic)
    torch.use_deterministic_algorithms(True)
    cudnn.benchmark, cudnn.deterministic = False, True
    try:
        _warm_cublas()
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        cudnn.benchmark, cudnn.deterministic = saved[2], saved[3]


def session(device: str) -> contextlib.AbstractContextManager[None]:
    """The settings every cell of a session on `device` runs under (see the module's contract)."""
    if device == "cuda":
        return _deterministic_cuda()
    if device == "cpu":
        return _one_thread()
    raise ValueError(f"the exactness suite runs on 'cpu' (CPU mode) or 'cuda', not {device!r}")
