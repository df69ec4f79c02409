"""stowage as torch's CUDA allocator, for the whole of this directory's pytest process.

stowage.enable(device="cuda") must run before anything initialises CUDA, so it runs here, at
import of this conftest, before pytest imports any test module. Without a CUDA device every
test here is skipped (torch.cuda.device_count() asks NVML or the runtime and does not
initialise torch's CUDA state). If enable() itself fails, every test fails with its error.

    python3 -m pytest tests/gpu/python -v      # run alone: tests/python puts stowage in CPU mode
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import stowage

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
E2E = REPO / "bench" / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))

HAS_GPU: bool = torch.cuda.device_count() > 0
ENABLE_ERROR: str | None = None

if HAS_GPU:
    try:
        # STOWAGE_ALLOC_CONF may already have installed stowage at `import torch` (the .pth hook).
        if not stowage.is_enabled():
            stowage.enable(device="cuda")
    except Exception as error:  # reported by every test, see stowage_is_enabled below
        ENABLE_ERROR = f"{type(error).__name__}: {error}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips this directory's tests when there is no CUDA device."""
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device: torch.cuda.device_count() == 0")
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def stowage_is_enabled() -> Iterator[None]:
    """Fails a test at once when stowage could not be made torch's CUDA allocator."""
    if ENABLE_ERROR is not None:
        pytest.fail(f"stowage.enable(device='cuda') failed in conftest: {ENABLE_ERROR}", pytrace=False)
    yield
