"""What PyTorch's own CUDA caching allocator would reserve for a trace: its rules, replayed.

    python bench/replay/native_rules.py [--capacity-ratio R ...] TRACE...

A trace recorded on the CPU (bench/traces) has no figure from torch's CUDA allocator, so this
replays its alloc and free events under that allocator's rules with the defaults a user has
(no PYTORCH_CUDA_ALLOC_CONF; c10/cuda/CUDACachingAllocator.cpp):

- sizes rounded up to 512 B; requests up to 1 MiB go to the small pool, the rest to the large;
- a new segment holds 2 MiB for the small pool, 20 MiB for a large request under 10 MiB, and
  the request rounded up to 2 MiB from 10 MiB;
- best fit: the smallest free block of the same stream and pool that holds the request, lowest
  address on ties; a block is split when the remainder is at least 512 B (small pool) or more
  than 1 MiB (large pool); freed blocks merge with free neighbours;
- segments are kept; when the device (of the capacity given) cannot hold a new one, every wholly
  free segment goes back and the allocation is tried again, else the trace is out of memory.

It prints the peak reserved bytes and its ratio to the peak of requested bytes, on a device with
room to spare and on devices of the capacity ratios asked for (as a multiple of that peak).
Checked against traces recorded on a GPU, where torch's own figure is known
(bench/results/2026-11-24-cpu-steady-state.md).
"""

from __future__ import annotations

import argparse
import bisect
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
MIN_LARGE_ALLOC = 10 << 20
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20
ALLOC, FREE = 0, 1


def round_size(size: int) -> int:
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def allocation_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class Block:
    address: int
    size: int
    stream: int
    small: bool
    segment: int  # the base address of its segment
    prev: Block | None = None
    next: Block | None = None
    allocated: bool = False


@dataclass
class NativeAllocator:
    """torch's caching allocator's rules over a device of `capacity` bytes (None: unbounded)."""

    capacity: int | None = None
    reserved: int = 0
    peak_reserved: int = 0
    free: dict[bool, list[tuple[int, int, int]]] = field(
        default_factory=lambda: {True: [], False: []})  # (stream, size, address) per pool
    blocks: dict[int, Block] = field(default_factory=dict)  # free blocks by address
    segments: dict[int, Block] = field(default_factory=dict)  # first block by segment base
    next_address: int = 1 << 40

    def malloc(self, size: int, stream: int) -> Block | None:
        size = round_size(size)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, stream, small)
        if block is None:
            block = self._new_segment(size, stream, small)
        if block is None and self._release_free_segments():
            block = self._new_segment(size, stream, small)
        if block is None:
            return None
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = Block(block.address + size, remaining, stream, small, block.segment, block,
                         block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert(rest)
        block.allocated = True
        return block

    def release(self, block: Block) -> None:
        block.allocated = False
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated:
                continue
            self._remove(neighbour)
            if neighbour is block.prev:
                block.address, block.prev = neighbour.address, neighbour.prev
                if block.prev is None:
                    self.segments[block.segment] = block
                else:
                    block.prev.next = block
            else:
                block.next = neighbour.next
                if block.next is not None:
                    block.next.prev = block
            block.size += neighbour.size
        self._insert(block)

    def _best_fit(self, size: int, stream: int, small: bool) -> Block | None:
        pool = self.free[small]
        index = bisect.bisect_left(pool, (stream, size, 0))
        if index == len(pool) or pool[index][0] != stream:
            return None
        block = self.blocks[pool[index][2]]
        self._remove(block)
        return block

    def _new_segment(self, size: int, stream: int, small: bool) -> Block | None:
        bytes_ = allocation_size(size)
        if self.capacity is not None and self.reserved + bytes_ > self.capacity:
            return None
        base = self.next_address
        self.next_address += bytes_ + ROUND_LARGE  # segments never touch
        self.reserved += bytes_
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        block = Block(base, bytes_, stream, small, base)
        self.segments[base] = block
        return block

    def _release_free_segments(self) -> bool:
        released = False
        for base, first in list(self.segments.items()):
            if first.allocated or first.next is not None or first.address not in self.blocks:
                continue
            self._remove(first)
            del self.segments[base]
            self.reserved -= first.size
            released = True
        return released

    def _insert(self, block: Block) -> None:
        bisect.insort(self.free[block.small], (block.stream, block.size, block.address))
        self.blocks[block.address] = block

    def _remove(self, block: Block) -> None:
        pool = self.free[block.small]
        del pool[bisect.bisect_left(pool, (block.stream, block.size, block.address))]
        del self.blocks[block.address]


@dataclass
class NativeResult:
    peak_requested: int
    peak_reserved: int
    oom: bool


def replay(kinds: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, streams: np.ndarray,
           capacity: int | None = None) -> NativeResult:
    """Replays device_event_arrays' arrays (stowage.replay) under torch's rules."""
    allocator = NativeAllocator(capacity)
    live: dict[int, tuple[Block | None, int]] = {}
    requested = peak = 0
    oom = False
    for kind, address, size, stream in zip(kinds.tolist(), addresses.tolist(), sizes.tolist(),
                                           streams.tolist()):
        if kind == FREE or (kind == ALLOC and address in live):
            held = live.pop(address, None)
            if held is not None:
                requested -= held[1]
                if held[0] is not None:
                    allocator.release(held[0])
        if kind != ALLOC or size == 0:
            continue
        block = None if oom else allocator.malloc(size, stream)
        oom = oom or block is None
        live[address] = (block, size)
        requested += size
        peak = max(peak, requested)
    return NativeResult(peak, allocator.peak_reserved, oom)


def main() -> None:
    from stowage.snapshot_reader import load_snapshot_columnar
    from stowage.replay import device_event_arrays

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--capacity-ratio", type=float, action="append", default=[],
                        help="also on a device this many times the peak of requested bytes")
    args = parser.parse_args()
    for name in args.traces:
        for device, trace in enumerate(load_snapshot_columnar(name)["device_traces"]):
            arrays = device_event_arrays(trace)
            roomy = replay(*arrays)
            line = (f"{Path(name).name} device {device}: peak requested "
                    f"{roomy.peak_requested / 2**20:,.0f} MiB, torch reserves "
                    f"{roomy.peak_reserved / 2**20:,.0f} MiB "
                    f"({roomy.peak_reserved / max(roomy.peak_requested, 1):.3f})")
            for ratio in args.capacity_ratio:
                tight = replay(*arrays, capacity=int(ratio * roomy.peak_requested))
                line += (f"; on {ratio:g}x: {tight.peak_reserved / 2**20:,.0f} MiB"
                         f"{' (out of memory)' if tight.oom else ''}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
