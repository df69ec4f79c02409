"""bench/replay/native_rules.py: PyTorch's allocator's rules, replayed, give what torch reserves."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import REPO, SHARED_TRACES, MiB

sys.path.insert(0, str(REPO / "bench" / "replay"))
import native_rules  # noqa: E402

from stowage.snapshot_reader import load_snapshot_columnar  # noqa: E402
from stowage.replay import device_event_arrays  # noqa: E402

ALLOC, FREE = 0, 1


def arrays(events: list[tuple[int, int, int]]) -> tuple[np.ndarray, ...]:
    kinds, addresses, sizes = zip(*events)
    return (np.asarray(kinds, np.uint8), np.asarray(addresses, np.uint64),
            np.asarray(sizes, np.uint64), np.zeros(len(events), np.uint64))


def test_medium_requests_share_a_20_mib_segment_and_large_ones_get_their_own() -> None:
    result = native_rules.replay(*arrays([
        (ALLOC, 1, 3 * MiB),   # a 20 MiB segment, split
        (ALLOC, 2, 5 * MiB),   # the rest of it
        (ALLOC, 3, 13 * MiB),  # 12 MiB are left there: its own segment, rounded to 14 MiB
        (ALLOC, 4, 1000),      # a 2 MiB small segment
    ]))
    assert result.peak_reserved == (20 + 14 + 2) * MiB
    assert result.peak_requested == 21 * MiB + 1000
    assert not result.oom


def test_a_freed_block_is_reused_by_best_fit_and_segments_stay() -> None:
    result = native_rules.replay(*arrays([
        (ALLOC, 1, 12 * MiB),
        (FREE, 1, 0),
        (ALLOC, 2, 11 * MiB),  # fits the cached 12 MiB segment; 1 MiB is too little to split off
        (FREE, 2, 0),
        (ALLOC, 3, 14 * MiB),  # a new segment: the cached one is kept, not given back
    ]))
    assert result.peak_reserved == 26 * MiB


def test_out_of_room_the_cached_segments_go_back_before_it_fails() -> None:
    events = [(ALLOC, 1, 12 * MiB), (FREE, 1, 0), (ALLOC, 2, 14 * MiB), (ALLOC, 3, 14 * MiB)]
    assert not native_rules.replay(*arrays(events), capacity=28 * MiB).oom
    assert native_rules.replay(*arrays(events), capacity=26 * MiB).oom


TRANSFORMER = SHARED_TRACES / "gpu_transformer2.7b_ctx128_fullstep.pickle"


@pytest.mark.skipif(not TRANSFORMER.exists(), reason="../shared/traces is not beside this clone")
def test_the_rules_reserve_what_torch_reserved_on_a_real_gpu_step() -> None:
    """The 2.7B step was recorded on a GPU, where torch's allocator reserved 45,154 MiB."""
    trace = load_snapshot_columnar(TRANSFORMER)["device_traces"][0]
    assert native_rules.replay(*device_event_arrays(trace)).peak_reserved == 45_154 * MiB
