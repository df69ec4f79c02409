"""stowage as PyTorch's CUDA allocator, on a real GPU, through torch's own APIs.

conftest.py has called stowage.enable(device="cuda") before anything initialised CUDA, so every
CUDA tensor here comes from stowage. The tests check what a PyTorch user relies on: tensors
never overlap and keep their contents, streams are respected, out-of-memory is torch's
exception, torch.cuda's statistics, summary and snapshot describe stowage's memory, and CUDA
graphs, MemPool, cudnn.benchmark, torch.compile and a GPT-2 training step work.

Figures from the allocator's design that the assertions rely on: requests are rounded to 512 B;
on an H100 the default configuration takes the paged path, whose pages are 2 MiB (PAGE).
"""

from __future__ import annotations

import bisect
import copy
import functools
import gc
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import stowage

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
PAGE = 2 * MiB  # one physical page of the paged path: the slack allowed where pages are shared
DEVICE = "cuda"
THIS_FILE = os.path.basename(__file__)

# The keys of torch.cuda.memory_stats() that stowage.memory_stats() must also have.
STAT_TYPES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
              "active_bytes", "inactive_split_bytes", "requested_bytes")
STANDARD_KEYS = (
    [f"{stat}.{pool}.{field}" for stat in STAT_TYPES for pool in ("all", "large_pool", "small_pool")
     for field in ("current", "peak", "allocated", "freed")]
    + [f"{stat}.{field}" for stat in ("oversize_allocations", "oversize_segments")
       for field in ("current", "peak", "allocated", "freed")]
    + ["num_ooms", "num_alloc_retries"]
)
STOWAGE_EXTRA_KEYS = ("mapped_pages.current", "num_maps", "num_unmaps")


# ---------------------------------------------------------------------------------------------
# Helpers


def settle() -> None:
    """Drops unreachable tensors and waits for the device, so the figures read are final."""
    gc.collect()
    torch.cuda.synchronize()


def overlaps(a: torch.Tensor, b_start: int, b_end: int) -> bool:
    """Whether the bytes of ``a`` overlap [b_start, b_end)."""
    start = a.data_ptr()
    return start < b_end and b_start < start + a.untyped_storage().nbytes()


@functools.cache
def cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured (median of three)."""
    cycles = 20_000_000
    rates = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rates.append(cycles / max(start.elapsed_time(end), 1e-3))
    return statistics.median(rates)


def run_python(code: str, env: dict[str, str | None] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter (allocator choice is per process); ``env`` entries of
    None are removed from the environment."""
    environment = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=environment)


def last_json_line(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON object a subprocess printed last; fails with its output when there is none."""
    for line in reversed(result.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    pytest.fail(f"no result (rc {result.returncode})\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")


def active_blocks(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [block for segment in segments for block in segment["blocks"]
            if block["state"] == "active_allocated"]


def block_containing(segments: list[dict[str, Any]], pointer: int) -> dict[str, Any] | None:
    """The block of ``segments`` whose bytes include ``pointer``."""
    for segment in segments:
        for block in segment["blocks"]:
            if block["address"] <= pointer < block["address"] + block["size"]:
                return block
    return None


def segment_containing(segments: list[dict[str, Any]], pointer: int) -> dict[str, Any] | None:
    for segment in segments:
        if segment["address"] <= pointer < segment["address"] + segment["total_size"]:
            return segment
    return None


# ---------------------------------------------------------------------------------------------
# Installation


def test_stowage_serves_torch_cuda_tensors() -> None:
    assert stowage.is_enabled()
    settle()
    before = stowage.memory_allocated()
    tensor = torch.empty(3 * MiB + 5, dtype=torch.uint8, device=DEVICE)
    assert stowage.memory_allocated() - before >= 3 * MiB + 5
    assert torch.cuda.memory_allocated() == stowage.memory_allocated()
    del tensor
    assert stowage.memory_allocated() == before


def test_enable_after_cuda_is_initialised_raises_and_names_the_variable() -> None:
    result = run_python("""
        import json, torch
        torch.zeros(1, device="cuda")
        import stowage
        try:
            stowage.enable(device="cuda")
            outcome = {"raised": None}
        except RuntimeError as error:
            outcome = {"raised": str(error)}
        outcome["enabled"] = stowage.is_enabled()
        print(json.dumps(outcome))
    """, env={"STOWAGE_ALLOC_CONF": None})
    outcome = last_json_line(result)
    assert outcome["raised"] is not None, "enable() after CUDA initialisation must raise RuntimeError"
    assert "STOWAGE_ALLOC_CONF" in outcome["raised"]
    assert outcome["enabled"] is False


@pytest.mark.parametrize("conf", ["", "max_split_size_mb:64,reserve_headroom:0.1"])
def test_the_environment_variable_installs_stowage_at_import_torch(conf: str) -> None:
    result = run_python("""
        import json, torch
        x = torch.ones(1 << 20, device="cuda")   # 4 MiB, before stowage is imported here
        import stowage
        print(json.dumps({"enabled": stowage.is_enabled(), "stowage": stowage.memory_allocated(),
                          "torch": torch.cuda.memory_allocated(), "sum": x.sum().item()}))
    """, env={"STOWAGE_ALLOC_CONF": conf})
    outcome = last_json_line(result)
    assert outcome["enabled"] is True, "STOWAGE_ALLOC_CONF set: the .pth hook must install stowage"
    assert outcome["stowage"] >= 4 * MiB
    assert outcome["stowage"] == outcome["torch"]
    assert outcome["sum"] == float(1 << 20)


@pytest.mark.parametrize("conf", [None, "max_split_size_mb:64,reserve_headroom:0.1"])
def test_enable_with_and_without_a_configuration_string(conf: str | None) -> None:
    call = 'stowage.enable(device="cuda")' if conf is None else f'stowage.enable({conf!r}, device="cuda")'
    result = run_python(f"""
        import json, torch, stowage
        {call}
        x = torch.ones(1 << 20, device="cuda")
        print(json.dumps({{"enabled": stowage.is_enabled(), "stowage": stowage.memory_allocated(),
                          "torch": torch.cuda.memory_allocated(), "sum": x.sum().item()}}))
    """, env={"STOWAGE_ALLOC_CONF": None})
    outcome = last_json_line(result)
    assert outcome["enabled"] is True
    assert outcome["stowage"] >= 4 * MiB
    assert outcome["stowage"] == outcome["torch"]
    assert outcome["sum"] == float(1 << 20)


def test_c_library_works_as_a_cuda_pluggable_allocator() -> None:
    path = stowage.c_library_path()
    assert os.path.isfile(path), path
    result = run_python(f"""
        import json, torch
        allocator = torch.cuda.memory.CUDAPluggableAllocator({path!r}, "stowage_malloc", "stowage_free")
        torch.cuda.memory.change_current_allocator(allocator)
        torch.manual_seed(0)
        a = torch.randn(512, 512, device="cuda")
        b = torch.randn(512, 512, device="cuda")
        product_ok = torch.allclose((a @ b).cpu().double(), a.cpu().double() @ b.cpu().double(),
                                    rtol=1e-3, atol=1e-3)
        import ctypes, stowage
        before = stowage.memory_allocated()       # stowage's API sees the C library's allocator
        tensors = [torch.full((1 + (i * 7919) % (1 << 22),), i % 251, dtype=torch.uint8, device="cuda")
                   for i in range(300)]
        contents_ok = all(bool((t == i % 251).all()) for i, t in enumerate(tensors))
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel()) for t in tensors)
        disjoint = all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
        during = stowage.memory_stats()
        del tensors
        torch.cuda.synchronize()
        after = stowage.memory_stats()
        stowage.record_history(True)
        lib = ctypes.CDLL({path!r})
        lib.stowage_malloc.restype = ctypes.c_void_p
        lib.stowage_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.stowage_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        ptr = lib.stowage_malloc(1000, 0, None)
        lib.stowage_free(ptr, 1024, 0, None)      # not the size it was allocated as: kept
        kept = stowage.memory_allocated() - after["allocated_bytes.all.current"]
        lib.stowage_free(ptr, 1000, 0, None)
        snapshot = stowage.snapshot()
        actions = [e["action"] for e in snapshot["device_traces"][0] if e["addr"] == ptr]
        stowage.empty_cache()                     # the C library's allocators give back free pages
        print(json.dumps({{"product_ok": product_ok, "contents_ok": contents_ok, "disjoint": disjoint,
                          "before": before, "allocated_during": during["allocated_bytes.all.current"],
                          "allocated_after": after["allocated_bytes.all.current"],
                          "invalid_frees_after": after["num_invalid_frees"],
                          "kept": kept, "invalid_frees_end": stowage.memory_stats()["num_invalid_frees"],
                          "actions": actions, "reserved_end": stowage.memory_reserved()}}))
    """, env={"STOWAGE_ALLOC_CONF": None})
    outcome = last_json_line(result)
    assert outcome["product_ok"] and outcome["contents_ok"] and outcome["disjoint"], outcome
    assert outcome["allocated_during"] >= outcome["before"] + 300 * 512, outcome
    # torch passed every free the size it allocated: none was refused, all were freed.
    assert outcome["invalid_frees_after"] == 0, outcome
    assert outcome["allocated_after"] == outcome["before"], outcome
    assert outcome["kept"] == 1024 and outcome["invalid_frees_end"] == 1, outcome
    assert outcome["actions"] == ["alloc", "free_requested", "free_completed"], outcome
    assert outcome["reserved_end"] < outcome["allocated_during"], outcome


# ---------------------------------------------------------------------------------------------
# Allocation correctness


@dataclass
class Live:
    tensor: torch.Tensor
    tag: int
    start: int
    end: int


FUZZ_DTYPES = (torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.int32, torch.float32,
               torch.int64, torch.float64)


def test_fuzz_random_allocations_never_overlap_and_keep_their_contents() -> None:
    """PyTorch's allocator fuzz pattern: 10,000 random steps of alloc (1 B to 64 MiB,
    log-uniform, mixed dtypes), free and empty_cache; each tensor holds its own byte tag."""
    rng = random.Random(20261122)
    steps, live_cap = 10_000, 6 * GiB
    settle()
    torch.cuda.empty_cache()
    baseline = stowage.memory_allocated()
    reserved_at_start = stowage.memory_reserved()
    live: list[Live] = []
    starts: list[int] = []  # sorted start addresses of live tensors
    ends: dict[int, int] = {}
    live_bytes = 0
    next_id = 0

    def check(entry: Live) -> None:
        bad = int((entry.tensor.view(torch.uint8) != entry.tag).sum().item())
        assert bad == 0, f"{bad} of {entry.end - entry.start} bytes of a live tensor were overwritten"

    def free(index: int) -> None:
        nonlocal live_bytes
        entry = live[index]
        check(entry)
        live[index] = live[-1]
        live.pop()
        del starts[bisect.bisect_left(starts, entry.start)]
        del ends[entry.start]
        live_bytes -= entry.end - entry.start

    def allocate(step: int) -> None:
        nonlocal live_bytes, next_id
        dtype = rng.choice(FUZZ_DTYPES)
        numel = max(1, int(2 ** rng.uniform(0, 26)) // dtype.itemsize)
        tensor = torch.empty(numel, dtype=dtype, device=DEVICE)
        start, end = tensor.data_ptr(), tensor.data_ptr() + numel * dtype.itemsize
        at = bisect.bisect_left(starts, start)
        assert at == 0 or ends[starts[at - 1]] <= start, f"step {step}: new tensor overlaps a live one"
        assert at == len(starts) or end <= starts[at], f"step {step}: new tensor overlaps a live one"
        tag = next_id % 255 + 1
        next_id += 1
        tensor.view(torch.uint8).fill_(tag)
        starts.insert(at, start)
        ends[start] = end
        live.append(Live(tensor, tag, start, end))
        live_bytes += end - start

    def check_all() -> None:
        for index in range(len(live)):
            check(live[index])

    for step in range(steps):
        roll = rng.random()
        if roll < 0.002:
            torch.cuda.empty_cache()
        elif roll < 0.003 and live:
            for index in sorted(rng.sample(range(len(live)), len(live) // 2), reverse=True):
                free(index)
        elif live and (roll < 0.45 or live_bytes > live_cap):
            free(rng.randrange(len(live)))
        else:
            allocate(step)
        if step % 1000 == 999:
            check_all()
            allocated = stowage.memory_allocated()
            assert torch.cuda.memory_allocated() == allocated
            assert allocated - baseline >= live_bytes
            assert stowage.memory_reserved() >= allocated

    check_all()
    live.clear()
    settle()
    assert stowage.memory_allocated() == baseline
    assert torch.cuda.memory_allocated() == baseline
    torch.cuda.empty_cache()
    assert stowage.memory_reserved() <= reserved_at_start + PAGE


@pytest.mark.parametrize("owner", ["side", "default"])
def test_record_stream_keeps_memory_from_reuse_until_the_other_stream_is_done(owner: str) -> None:
    """A tensor made on stream A, read on stream B (record_stream(B)), then deleted: a new
    allocation on A must not take its memory while B, held busy by _sleep, has yet to read it."""
    side = torch.cuda.Stream()
    default = torch.cuda.current_stream()
    producer, consumer = (side, default) if owner == "side" else (default, side)
    numel = 16 * MiB // 4
    settle()
    result = torch.empty(numel, device=DEVICE)
    baseline_stats = stowage.memory_stats()
    sleep_cycles = int(cycles_per_ms() * 300)

    with torch.cuda.stream(producer):
        x = torch.full((numel,), 3.0, device=DEVICE)
    consumer.wait_stream(producer)
    x.record_stream(consumer)
    consumer_done = torch.cuda.Event()
    with torch.cuda.stream(consumer):
        torch.cuda._sleep(sleep_cycles)        # the consumer reads x only after 300 ms
        torch.mul(x, 2.0, out=result)
        consumer_done.record()
    x_start, x_end = x.data_ptr(), x.data_ptr() + x.untyped_storage().nbytes()
    del x
    with torch.cuda.stream(producer):
        still_reading = not consumer_done.query()
        y = torch.empty(numel, device=DEVICE)  # must not be x's memory while the consumer needs it
        y.fill_(-1.0)
    if still_reading:
        assert not overlaps(y, x_start, x_end), "record_stream ignored: the block was reused too soon"
    torch.cuda.synchronize()
    assert bool((result == 6.0).all()), "the consumer read memory that another stream overwrote"
    assert bool((y == -1.0).all())

    del y
    settle()
    torch.cuda.empty_cache()
    probe = torch.empty(1, device=DEVICE)  # a malloc, which collects completed stream events
    del probe
    stats = stowage.memory_stats()
    for key in ("allocated_bytes.all.current", "active_bytes.all.current"):
        assert stats[key] == baseline_stats[key], f"{key}: the record_stream free never completed"
    del result


def test_out_of_memory_raises_torch_out_of_memory_error_and_the_allocator_still_works() -> None:
    settle()
    torch_ooms = torch.cuda.memory_stats()["num_ooms"]
    stowage_ooms = stowage.memory_stats()["num_ooms"]
    allocated = stowage.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as raised:
        torch.empty(10 * TiB, dtype=torch.uint8, device=DEVICE)
    assert isinstance(raised.value, torch.cuda.OutOfMemoryError)
    message = str(raised.value)
    assert "stowage" in message, message
    assert re.search(r"\d+(\.\d+)?\s*(KiB|MiB|GiB|TiB)", message), message
    assert torch.cuda.memory_stats()["num_ooms"] == torch_ooms + 1
    assert stowage.memory_stats()["num_ooms"] == stowage_ooms + 1
    assert stowage.memory_allocated() == allocated

    tensors = [torch.full((size,), i + 1, dtype=torch.uint8, device=DEVICE)
               for i, size in enumerate((512, 64 * KiB, 1 * MiB, 64 * MiB, 1 * GiB))]
    assert all(bool((t == i + 1).all()) for i, t in enumerate(tensors))
    del tensors
    assert stowage.memory_allocated() == allocated


def test_set_per_process_memory_fraction_limits_the_reserve() -> None:
    settle()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    assert stowage.memory_reserved() < total // 10, "earlier tests left too much memory reserved"
    torch.cuda.set_per_process_memory_fraction(0.25)
    try:
        with pytest.raises(torch.OutOfMemoryError) as raised:
            torch.empty(int(total * 0.3), dtype=torch.uint8, device=DEVICE)
        assert "stowage" in str(raised.value)
        within = torch.empty(int(total * 0.1), dtype=torch.uint8, device=DEVICE)
        assert stowage.memory_reserved() <= total * 0.25
        del within
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    bigger = torch.empty(int(total * 0.3), dtype=torch.uint8, device=DEVICE)  # the limit is lifted
    del bigger
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Statistics, summary, snapshot


def assert_stats_match() -> None:
    """torch.cuda.memory_stats() and stowage.memory_stats() agree on every key they share, and
    both have the standard keys."""
    ours = stowage.memory_stats()
    theirs = torch.cuda.memory_stats()
    missing = [key for key in STANDARD_KEYS if key not in ours or key not in theirs]
    assert not missing, f"keys missing: {missing}"
    different = {key: (theirs[key], ours[key]) for key in theirs if key in ours and theirs[key] != ours[key]}
    assert not different, f"torch.cuda.memory_stats() != stowage.memory_stats() (torch, stowage): {different}"
    assert torch.cuda.memory_allocated() == stowage.memory_allocated() == ours["allocated_bytes.all.current"]
    assert torch.cuda.memory_reserved() == stowage.memory_reserved() == ours["reserved_bytes.all.current"]
    assert torch.cuda.max_memory_allocated() == stowage.max_memory_allocated() == ours["allocated_bytes.all.peak"]
    assert torch.cuda.max_memory_reserved() == stowage.max_memory_reserved() == ours["reserved_bytes.all.peak"]


def test_memory_stats_match_between_torch_cuda_and_stowage() -> None:
    settle()
    stats = stowage.memory_stats()
    for key in STOWAGE_EXTRA_KEYS:
        assert isinstance(stats[key], int) and stats[key] >= 0, key
    assert_stats_match()
    before = stowage.memory_stats()
    tensors = [torch.empty(size, dtype=torch.uint8, device=DEVICE) for size in (100, 700 * KiB, 3 * MiB, 300 * MiB)]
    assert_stats_match()
    after = stowage.memory_stats()
    assert after["allocation.all.current"] == before["allocation.all.current"] + 4
    assert after["allocation.small_pool.current"] >= before["allocation.small_pool.current"] + 2
    assert after["allocation.large_pool.current"] >= before["allocation.large_pool.current"] + 2
    assert after["requested_bytes.all.current"] == before["requested_bytes.all.current"] + sum(
        t.numel() for t in tensors)
    assert after["active_bytes.all.current"] >= after["allocated_bytes.all.current"]
    assert after["segment.all.current"] >= 1
    del tensors
    assert_stats_match()
    assert stowage.memory_stats()["allocation.all.current"] == before["allocation.all.current"]


@pytest.mark.parametrize("reset", ["torch", "stowage"])
def test_reset_peak_stats_is_seen_by_both(reset: str) -> None:
    settle()
    peak_tensor = torch.empty(512 * MiB, dtype=torch.uint8, device=DEVICE)
    del peak_tensor
    assert stowage.max_memory_allocated() >= stowage.memory_allocated() + 512 * MiB
    (torch.cuda.reset_peak_memory_stats if reset == "torch" else stowage.reset_peak_stats)()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    assert stowage.max_memory_allocated() == stowage.memory_allocated()
    assert torch.cuda.max_memory_reserved() == torch.cuda.memory_reserved()
    assert_stats_match()
    again = torch.empty(64 * MiB, dtype=torch.uint8, device=DEVICE)
    del again
    assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated() + 64 * MiB
    assert_stats_match()


def test_memory_summary_from_torch_cuda_and_stowage() -> None:
    settle()
    held = torch.empty(40 * MiB, dtype=torch.uint8, device=DEVICE)
    theirs = torch.cuda.memory_summary(abbreviated=True)
    ours = stowage.memory_summary(abbreviated=True)
    full = torch.cuda.memory_summary()
    assert "Allocated memory" in full and "from large pool" in full

    def row(summary: str) -> str:
        rows = [line for line in summary.splitlines() if line.startswith("| Allocated memory")]
        assert len(rows) == 1, summary
        return rows[0]

    assert row(theirs) == row(ours), f"\n{theirs}\n{ours}"
    del held


def test_snapshot_segments_are_stowages_memory() -> None:
    settle()
    tensors = [torch.empty(size, dtype=torch.uint8, device=DEVICE)
               for size in (1000, 17 * KiB, 3 * MiB + 1, 100 * MiB)]
    for name, snapshot in (("torch", torch.cuda.memory._snapshot()), ("stowage", stowage.snapshot())):
        assert "segments" in snapshot and "device_traces" in snapshot, name
        segments = snapshot["segments"]
        assert sum(s["total_size"] for s in segments) == stowage.memory_reserved() == torch.cuda.memory_reserved(), name
        assert sum(b["size"] for b in active_blocks(segments)) == stowage.memory_allocated(), name
        for tensor in tensors:
            block = block_containing(segments, tensor.data_ptr())
            assert block is not None, f"{name}: a live tensor is in no segment"
            assert block["state"] == "active_allocated", name
            assert block["address"] == tensor.data_ptr(), name
            assert block["size"] >= tensor.numel() and block["requested_size"] == tensor.numel(), name
            assert block["size"] % 512 == 0, name
    del tensors


def test_empty_cache_returns_freed_pages_and_the_paged_pool_counts_them() -> None:
    settle()
    torch.cuda.empty_cache()
    reserved_empty = torch.cuda.memory_reserved()
    maps = stowage.memory_stats()["num_maps"]
    big = torch.empty(1 * GiB, dtype=torch.uint8, device=DEVICE)
    reserved_full = torch.cuda.memory_reserved()
    assert reserved_full >= reserved_empty + 1 * GiB - PAGE
    stats = stowage.memory_stats()
    assert stats["num_maps"] > maps, "1 GiB after empty_cache must map new pages"
    assert stats["mapped_pages.current"] * PAGE >= 1 * GiB
    del big
    assert torch.cuda.memory_reserved() == reserved_full, "a freed block stays cached until empty_cache"
    unmaps = stowage.memory_stats()["num_unmaps"]
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= reserved_empty + PAGE
    assert stowage.memory_stats()["num_unmaps"] > unmaps
    assert_stats_match()


def _allocate_for_history_test(size: int) -> torch.Tensor:
    """An allocation whose frame the history test looks for."""
    return torch.empty(size, dtype=torch.uint8, device=DEVICE)


def test_record_memory_history_and_snapshot_show_alloc_free_and_oom_events() -> None:
    settle()
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    try:
        freed = _allocate_for_history_test(5 * MiB + 3)
        freed_address = freed.data_ptr()
        del freed
        held = _allocate_for_history_test(7 * MiB + 5)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(10 * TiB, dtype=torch.uint8, device=DEVICE)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert "segments" in snapshot and "device_traces" in snapshot
    trace = snapshot["device_traces"][torch.cuda.current_device()]

    def ours(frames: list[dict[str, Any]]) -> bool:
        return any(frame["filename"].endswith(THIS_FILE) and frame["name"] == "_allocate_for_history_test"
                   for frame in frames)

    allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == freed_address and e["size"] >= 5 * MiB + 3]
    assert allocs, "no alloc event for the freed tensor"
    assert ours(allocs[-1]["frames"]), f"alloc frames do not name this file: {allocs[-1]['frames']}"
    assert any(e["action"] in ("free_requested", "free_completed") and e["addr"] == freed_address for e in trace)
    assert any(e["action"] == "oom" for e in trace), "no oom event"
    held_allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == held.data_ptr()]
    assert held_allocs and ours(held_allocs[-1]["frames"])
    block = block_containing(snapshot["segments"], held.data_ptr())
    assert block is not None and block["state"] == "active_allocated"
    assert ours(block["frames"]), "the live block's frames do not name this file"

    from torch.cuda import _memory_viz

    assert "Summary of segments" in _memory_viz.segsum(snapshot)  # reads every segment and block
    assert "entries" in _memory_viz.trace(snapshot)                 # reads every trace entry
    assert len(_memory_viz.trace_plot(snapshot)) > 0                # the snapshot pickles
    del held


def test_a_snapshot_of_stowage_s_memory_carries_its_mark_and_is_not_advised_stowage_s_allocator() -> None:
    """torch's snapshot of stowage's memory names stowage in allocator_settings (the mark
    stowage.inspection.findings reads), so `stowage inspect` never advises it the allocator it already uses."""
    from stowage.inspection.findings import inspect_device, recorded_by_stowage

    settle()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        held = torch.empty(MiB, dtype=torch.uint8, device=DEVICE)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(10 * TiB, dtype=torch.uint8, device=DEVICE)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    del held
    assert snapshot["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"].startswith("stowage:"), snapshot["allocator_settings"]
    assert recorded_by_stowage(snapshot)
    report = inspect_device(snapshot, torch.cuda.current_device(), 5)
    assert report["ooms"] and report["ooms"][0]["under_stowage"]


def _history_text(context: str | None) -> str:
    """The JSON of a snapshot taken after allocating in `thealloc` and freeing in `thefree`, with
    history recorded under torch's record mode `context`."""
    x = None

    def thealloc() -> None:
        nonlocal x
        x = torch.rand(3, 4, device=DEVICE)

    def thefree() -> None:
        nonlocal x
        del x

    settle()
    torch.cuda.memory._record_memory_history(context=context, stacks="python", max_entries=100_000)
    try:
        thealloc()
        thefree()
        return json.dumps(torch.cuda.memory._snapshot())
    finally:
        torch.cuda.memory._record_memory_history(None)


def test_record_memory_history_keeps_the_stacks_its_context_asks_for() -> None:
    """As torch's test_memory_plots_free_stack: "all" keeps every event's stack, "alloc" only the
    allocations', "state" only the live blocks' (none in the trace)."""
    for context in ("alloc", "all", "state"):
        text = _history_text(context)
        assert ("thefree" in text) == (context == "all"), context
        assert ("thealloc" in text) == (context != "state"), context


def test_set_memory_metadata_tags_each_event_recorded_while_it_is_set() -> None:
    """As torch's test_memory_plots_metadata: every event recorded while metadata is set carries
    it; events recorded after it is cleared do not."""
    settle()
    torch.cuda.memory._set_memory_metadata("metadata test")
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        x = torch.rand(3, 4, device=DEVICE)
        del x
        settle()
        torch.cuda.memory._set_memory_metadata("")
        after = torch.rand(5, 4, device=DEVICE)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._set_memory_metadata("")
        torch.cuda.memory._record_memory_history(None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    tags = [event["user_metadata"] for event in trace]
    set_for = tags.index("") if "" in tags else len(tags)  # the events recorded while it was set, first
    assert set_for > 0 and tags == ["metadata test"] * set_for + [""] * (len(tags) - set_for), tags
    assert [e["user_metadata"] for e in trace if e["action"] == "alloc" and e["addr"] == after.data_ptr()] == [""]
    assert torch.cuda.memory._get_memory_metadata() == ""
    del after


def test_torch_profiler_sees_stowage_s_allocations_and_frees() -> None:
    """torch.profiler(profile_memory=True) hears of stowage's blocks as of torch's allocator's
    (torch's test_memory_profiler_viz draws from these events)."""
    settle()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.empty(3 * MiB, dtype=torch.uint8, device=DEVICE)
        del x
    usage = [event.device_memory_usage for event in prof.events()]
    assert max(usage) >= 3 * MiB and min(usage) <= -3 * MiB, usage


@pytest.mark.parametrize("fraction", ["0.25", "0.0"])
def test_pytorch_cuda_alloc_conf_per_process_memory_fraction_caps_stowage(fraction: str) -> None:
    result = run_python("""
        import json, torch
        total = torch.cuda.get_device_properties(0).total_memory
        outcome = {"backend": torch.cuda.get_allocator_backend(),
                   "fraction": torch.cuda.get_per_process_memory_fraction(0)}
        try:
            torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
            outcome["capped"] = False
        except torch.OutOfMemoryError:
            outcome["capped"] = True
        print(json.dumps(outcome))
    """, env={"STOWAGE_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": f"per_process_memory_fraction:{fraction}"})
    assert last_json_line(result) == {"backend": "stowage", "fraction": float(fraction), "capped": True}


def test_a_bad_per_process_memory_fraction_in_pytorch_cuda_alloc_conf_is_refused_as_torch_refuses_it() -> None:
    result = run_python("""
        import torch
        print(torch.cuda.get_per_process_memory_fraction(0))
    """, env={"STOWAGE_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:1.5"})
    assert result.returncode != 0 and "per_process_memory_fraction is invalid" in result.stderr, result.stderr


# ---------------------------------------------------------------------------------------------
# cuDNN, CUDA graphs, MemPool


@pytest.fixture
def cudnn_flags() -> Iterator[None]:
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32)
    yield
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32 = saved


def test_cudnn_benchmark_conv_net_forward_backward(cudnn_flags: None) -> None:
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 5, padding=2), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    ).to(DEVICE)
    x = torch.randn(8, 3, 64, 64, device=DEVICE)

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        net.zero_grad(set_to_none=True)
        out = net(x)
        out.square().mean().backward()
        return out.detach().clone(), [p.grad.detach().clone() for p in net.parameters()]

    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    reference_out, reference_grads = run()
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = True, False
    for _ in range(3):
        out, grads = run()
        assert bool(torch.isfinite(out).all())
        assert all(bool(torch.isfinite(g).all()) for g in grads)
        torch.testing.assert_close(out, reference_out, rtol=1e-3, atol=1e-4)
        for grad, reference in zip(grads, reference_grads):
            torch.testing.assert_close(grad, reference, rtol=1e-3, atol=1e-4)
    with torch.autocast(DEVICE, dtype=torch.float16):
        half = net(x.to(memory_format=torch.channels_last))
    assert bool(torch.isfinite(half).all())


def graph_ops(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """A few ops with intermediates (allocated from the graph's private pool during capture)."""
    hidden = torch.relu(x @ w1 + 0.5)
    return (hidden @ w2).softmax(dim=-1) * 3.0 + x.mean()


def follow_ops(y: torch.Tensor) -> torch.Tensor:
    return torch.tanh(y * 2.0 - 1.0).cumsum(dim=-1) + y.square()


GraphSetup = tuple[torch.cuda.Stream, torch.Tensor, torch.Tensor, torch.Tensor]


@pytest.fixture
def graph_setup() -> Iterator[GraphSetup]:
    """The capture stream, warmed up (cuBLAS workspaces exist before capture), and the inputs."""
    torch.manual_seed(0)
    stream = torch.cuda.Stream()
    w1 = torch.randn(1024, 2048, device=DEVICE) / 32
    w2 = torch.randn(2048, 1024, device=DEVICE) / 45
    static_x = torch.randn(2048, 1024, device=DEVICE)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            follow_ops(graph_ops(static_x, w1, w2))
    torch.cuda.current_stream().wait_stream(stream)
    follow_ops(graph_ops(static_x, w1, w2))  # and the default stream, where the eager references run
    settle()
    yield stream, static_x, w1, w2


def test_cuda_graph_capture_and_replay_matches_eager(graph_setup: GraphSetup) -> None:
    stream, static_x, w1, w2 = graph_setup
    torch.cuda.empty_cache()
    allocated, reserved = stowage.memory_allocated(), stowage.memory_reserved()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static_y = graph_ops(static_x, w1, w2)
    # Memory allocated after capture must not be the graph's: fill it, replay, and it is intact.
    others = [torch.full((size,), 0x5A, dtype=torch.uint8, device=DEVICE) for size in (4 * MiB, 16 * MiB, 40 * MiB)]
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    for _ in range(4):
        new_x = torch.randn(static_x.shape, device=DEVICE, generator=generator)
        static_x.copy_(new_x)
        graph.replay()
        torch.testing.assert_close(static_y, graph_ops(new_x, w1, w2), rtol=1e-4, atol=1e-5)
        assert all(bool((t == 0x5A).all()) for t in others), "graph replay wrote over memory allocated later"
    del others, static_y, graph, new_x
    settle()
    torch.cuda.empty_cache()
    assert stowage.memory_allocated() == allocated
    assert stowage.memory_reserved() <= reserved + PAGE, "the graph's private pool was not given back"


def test_cuda_graphs_sharing_a_pool(graph_setup: GraphSetup) -> None:
    stream, static_x, w1, w2 = graph_setup
    torch.cuda.empty_cache()
    allocated, reserved = stowage.memory_allocated(), stowage.memory_reserved()
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first, stream=stream):
        static_y = graph_ops(static_x, w1, w2)
    with torch.cuda.graph(second, pool=first.pool(), stream=stream):
        static_z = follow_ops(static_y)
    assert not overlaps(static_z, static_y.data_ptr(), static_y.data_ptr() + static_y.untyped_storage().nbytes())
    generator = torch.Generator(device=DEVICE).manual_seed(2)
    for _ in range(4):
        new_x = torch.randn(static_x.shape, device=DEVICE, generator=generator)
        static_x.copy_(new_x)
        first.replay()
        second.replay()
        expected_y = graph_ops(new_x, w1, w2)
        torch.testing.assert_close(static_y, expected_y, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(static_z, follow_ops(expected_y), rtol=1e-4, atol=1e-4)
    del static_y, static_z, first, second, new_x, expected_y
    settle()
    torch.cuda.empty_cache()
    assert stowage.memory_allocated() == allocated
    assert stowage.memory_reserved() <= reserved + PAGE, "the shared private pool was not given back"


def test_torch_mempool_is_supported_by_stowage() -> None:
    """torch.cuda.MemPool + use_mem_pool on stowage. A failure here (e.g. MemPool raising because
    stowage lacks pool support) is a real failure, not a skip."""
    settle()
    torch.cuda.empty_cache()
    allocated, reserved = stowage.memory_allocated(), stowage.memory_reserved()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        inside = torch.full((24 * MiB,), 11, dtype=torch.uint8, device=DEVICE)
        small = torch.full((3000,), 12, dtype=torch.uint8, device=DEVICE)
    outside = torch.full((24 * MiB,), 22, dtype=torch.uint8, device=DEVICE)
    assert bool((inside == 11).all()) and bool((small == 12).all()) and bool((outside == 22).all())
    assert not overlaps(outside, inside.data_ptr(), inside.data_ptr() + inside.numel())
    inside_address = inside.data_ptr()
    del inside
    with torch.cuda.use_mem_pool(pool):
        again = torch.full((24 * MiB,), 33, dtype=torch.uint8, device=DEVICE)
    assert again.data_ptr() == inside_address, "the pool's freed block was not reused inside the pool"
    assert bool((outside == 22).all()) and bool((again == 33).all())
    del again, small, outside, pool
    settle()
    torch.cuda.empty_cache()
    assert stowage.memory_allocated() == allocated
    assert stowage.memory_reserved() <= reserved + PAGE, "the MemPool's memory was not given back"


def test_torch_mempool_snapshot_lists_only_the_pools_memory() -> None:
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        inside = torch.empty(8 * MiB, dtype=torch.uint8, device=DEVICE)
    outside = torch.empty(8 * MiB, dtype=torch.uint8, device=DEVICE)
    segments = pool.snapshot()
    assert segment_containing(segments, inside.data_ptr()) is not None
    assert segment_containing(segments, outside.data_ptr()) is None
    everything = torch.cuda.memory._snapshot()["segments"]
    assert segment_containing(everything, inside.data_ptr()) is not None
    assert segment_containing(everything, outside.data_ptr()) is not None
    del inside, outside, pool
    settle()


# ---------------------------------------------------------------------------------------------
# torch.compile and a GPT-2 training step


class SmallMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                                    nn.LayerNorm(256), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_training_matches_eager(mode: str) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = SmallMLP().to(DEVICE)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, mode=mode)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.05)
    compiled_optimizer = torch.optim.SGD(compiled_model.parameters(), lr=0.05)
    generator = torch.Generator(device=DEVICE).manual_seed(3)

    def step(model: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
             x: torch.Tensor, target: torch.Tensor) -> float:
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    try:
        for _ in range(5):
            x = torch.randn(64, 128, device=DEVICE, generator=generator)
            target = torch.randint(0, 10, (64,), device=DEVICE, generator=generator)
            eager_loss = step(eager, eager_optimizer, x, target)
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            compiled_loss = step(compiled, compiled_optimizer, x, target)
            assert compiled_loss == pytest.approx(eager_loss, rel=1e-3, abs=1e-4)
        for (name, reference), parameter in zip(eager.named_parameters(), compiled_model.parameters()):
            torch.testing.assert_close(parameter, reference, rtol=1e-3, atol=1e-4, msg=name)
    finally:
        torch._dynamo.reset()


def test_gpt2_small_training_steps() -> None:
    from gpt2_model import GPT, GPTConfig, make_optimizer, random_batch, training_step

    settle()
    allocated = stowage.memory_allocated()
    torch.manual_seed(0)
    model = GPT(GPTConfig()).to(DEVICE)
    optimizer = make_optimizer(model)
    tokens, targets = random_batch(4, 1024, model.config.vocab_size, DEVICE,
                                   generator=torch.Generator().manual_seed(0))
    stowage.reset_peak_stats()
    losses = [training_step(model, optimizer, tokens, targets, torch.bfloat16).item() for _ in range(3)]
    torch.cuda.synchronize()
    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < losses[0], f"three AdamW steps on one batch did not lower the loss: {losses}"
    assert torch.cuda.max_memory_reserved() >= torch.cuda.max_memory_allocated() > 2 * GiB
    assert_stats_match()
    del model, optimizer, tokens, targets
    settle()
    # cuBLAS keeps per-thread workspaces (the autograd thread's too) from the caching allocator.
    assert stowage.memory_allocated() - allocated <= 128 * MiB


# ---------------------------------------------------------------------------------------------
# A true drop-in: what PyTorch's own test_cuda.py checks of its allocator, under stowage


def test_record_memory_history_with_torchs_defaults_keeps_every_event() -> None:
    """torch's defaults: max_entries=sys.maxsize (keep everything), context and stacks "all"."""
    settle()
    torch.cuda.memory._record_memory_history()
    try:
        kept = [torch.empty(1000 + i, dtype=torch.uint8, device=DEVICE) for i in range(100)]
        trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    addresses = {tensor.data_ptr() for tensor in kept}
    assert {e["addr"] for e in trace if e["action"] == "alloc"} >= addresses


def test_import_torch_with_stowage_creates_no_cuda_context() -> None:
    """test_cuda.py's test_lazy_init, with STOWAGE_ALLOC_CONF installing stowage at import torch:
    the device count is read after CUDA_VISIBLE_DEVICES changes, and the driver is still
    uninitialised (cuDeviceGetCount says CUDA_ERROR_NOT_INITIALIZED, 3)."""
    conf = {"STOWAGE_ALLOC_CONF": ""}
    result = run_python("""
        import os, torch
        from stowage import _torch
        os.environ['CUDA_VISIBLE_DEVICES'] = '32'
        print(torch.cuda.device_count(), _torch.cuda_enabled())
    """, env=conf)
    assert result.stdout.strip().splitlines()[-1:] == ["0 True"], result.stdout + result.stderr
    result = run_python("""
        import ctypes, torch
        x = ctypes.c_int(-1)
        print(ctypes.CDLL('libcuda.so.1').cuDeviceGetCount(ctypes.byref(x)))
    """, env=conf)
    assert result.stdout.strip().splitlines()[-1:] == ["3"], result.stdout + result.stderr


def test_is_pinned_and_a_forked_child_using_cuda_under_stowage() -> None:
    """test_cuda.py's test_is_pinned_no_context: is_pinned() on a CPU tensor creates no context,
    so a child forked afterwards can use CUDA (with stowage as its allocator too)."""
    result = run_python("""
        import multiprocessing, torch
        from stowage import _torch

        def worker(conn):
            try:
                x = torch.randn(10)
                x.is_pinned()
                dev = torch.accelerator.current_accelerator()
                conn.send((torch.ones(10, device=dev)[0].item(), _torch.cuda_enabled()))
            except Exception as e:
                conn.send(str(e))
            finally:
                conn.close()

        x = torch.randn(10)
        x.is_pinned()
        parent, child = multiprocessing.get_context("fork").Pipe()
        process = multiprocessing.get_context("fork").Process(target=worker, args=(child,))
        process.start()
        print(parent.recv())
        process.join()
    """, env={"STOWAGE_ALLOC_CONF": ""})
    assert result.stdout.strip().splitlines()[-1:] == ["(1.0, True)"], result.stdout + result.stderr


def test_out_of_memory_text_is_torchs() -> None:
    """test_cuda.py's test_out_of_memory; and what accelerate's batch-size finder looks for."""
    from accelerate.utils.memory import should_reduce_batch_size

    tensor = torch.zeros(1024, device=DEVICE)
    with pytest.raises(RuntimeError, match=f"Tried to allocate 800000000.00 GiB. GPU {tensor.device.index} "
                                           "has a total capacity of") as raised:
        torch.empty(1024 * 1024 * 1024 * 800000000, dtype=torch.int8, device=DEVICE)
    assert str(raised.value).startswith("CUDA out of memory. Tried to allocate 800000000.00 GiB. ")
    assert should_reduce_batch_size(raised.value)
    with pytest.raises(RuntimeError, match="Tried to allocate more than 1EB memory"):
        torch.empty(1024 * 1024 * 1024 * 8000000000, dtype=torch.int8, device=DEVICE)
    tensor.fill_(1)
    assert bool((tensor == 1).all())


def test_torchs_out_of_memory_retry_then_memory_fraction_tests_in_one_process() -> None:
    """test_cuda.py's test_out_of_memory_retry, then its test_set_per_process_memory_fraction, as
    its runner runs them: one after the other in one process."""
    settle()
    torch.cuda.empty_cache()
    total_memory = torch.cuda.get_device_properties(0).total_memory
    size = int(total_memory * 0.5)
    a = torch.empty(size, dtype=torch.int8, device=DEVICE)
    with pytest.raises(RuntimeError, match="Tried to allocate"):
        b = torch.empty(size, dtype=torch.int8, device=DEVICE)
    del a
    b = torch.empty(size, dtype=torch.int8, device=DEVICE)
    del b
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()

    orig = torch.cuda.get_per_process_memory_fraction(0)
    torch.cuda.reset_peak_memory_stats(0)
    try:
        tensor = torch.zeros(1024, device=DEVICE)
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(0.5, 0)
        application = int(total_memory * 0.499) - torch.cuda.max_memory_reserved()
        assert application > 0
        tmp_tensor = torch.empty(application, dtype=torch.int8, device=DEVICE)
        del tmp_tensor
        torch.cuda.empty_cache()
        with pytest.raises(RuntimeError, match="out of memory") as raised:
            torch.empty(int(total_memory * 0.5), dtype=torch.int8, device=DEVICE)
        message = str(raised.value)
        assert " allowed; " in message and "The cap is" in message, message
        assert "torch's per-process memory fraction (0.50)" in message, message
        tensor.fill_(1)
        assert bool((tensor == 1).all())
    finally:
        torch.cuda.set_per_process_memory_fraction(orig, 0)
    assert torch.cuda.get_per_process_memory_fraction(0) == orig


def test_caching_allocator_enable_false_serves_the_devices_own_memory_as_torch() -> None:
    """torch.cuda.caching_allocator_enable(False): each allocation is the device's own, returned
    when freed and counted in no statistic; tensors made either way are freed the right way
    after it changes back."""
    settle()
    torch.cuda.empty_cache()
    cached = torch.empty(MiB, dtype=torch.uint8, device=DEVICE)
    settle()
    stats = stowage.memory_stats()
    free_before = torch.cuda.mem_get_info()[0]
    torch.cuda.caching_allocator_enable(False)
    try:
        raw = torch.full((256 * MiB,), 7, dtype=torch.uint8, device=DEVICE)
        kept = torch.full((64 * MiB,), 5, dtype=torch.uint8, device=DEVICE)
        pointer = torch.cuda.caching_allocator_alloc(3 * MiB)
        assert torch.cuda.mem_get_info()[0] <= free_before - 320 * MiB
        assert torch.cuda.memory_allocated() == stats["allocated_bytes.all.current"]
        assert torch.cuda.memory_reserved() == stats["reserved_bytes.all.current"]
        torch.cuda.caching_allocator_delete(pointer)
        assert bool((raw == 7).all())
        del raw
        settle()
        assert torch.cuda.mem_get_info()[0] >= free_before - 80 * MiB, "freed memory goes back at once"
        del cached  # allocated with caching on: it goes back to the cache
    finally:
        torch.cuda.caching_allocator_enable(True)
    assert bool((kept == 5).all())
    del kept  # allocated with caching off: back to the device
    settle()
    assert torch.cuda.mem_get_info()[0] >= free_before - 16 * MiB
    after = stowage.memory_stats()
    assert after["num_invalid_frees"] == stats["num_invalid_frees"]
    assert after["allocated_bytes.all.current"] == stats["allocated_bytes.all.current"] - MiB
