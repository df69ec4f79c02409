"""Shared helpers for the Python tests."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_TRACES = REPO.parent / "shared" / "traces"
MiB = 1 << 20


def stowage(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs the stowage command in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "stowage", *args], capture_output=True, text=True)


def event(action: str, addr: int, size: int, stream: int = 0) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": stream}


@pytest.fixture(scope="module")
def cpu_mode_module() -> Any:
    """CPU mode for a whole test module, at the one capacity the CPU-mode modules share (CPU
    mode's device is per process)."""
    import stowage

    stowage.enable(device="cpu", capacity="4GiB")
    yield
    stowage.mark_step()
    stowage.disable()


@pytest.fixture
def write_snapshot(tmp_path: Path):
    """Writes a snapshot dict (or raw bytes) to a file and returns its path."""

    def write(content: dict[str, Any] | bytes, name: str = "snapshot.pickle") -> Path:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else pickle.dumps(content, protocol=4))
        return path

    return write


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help="exactness suite: the whole matrix (every model x pattern x feature), more steps and sizes")
