"""A synthetic memory snapshot of any size, in the shape stock PyTorch writes.

    bench/inspect/synthetic_snapshot.py OUT --events N [--frames 36] [--stacks 256] [--segments 200]
                                        [--shared-lists]

torch.cuda.memory._dump_snapshot pickles its dict with the C pickler (protocol 4): every dict,
list and string is memoized, so a frame ({filename, line, name}) is written once and every later
stack refers to it with a memo reference, while each trace event carries a list of its own
holding those references. This writes the same bytes without building the snapshot in memory
(a 1 GB file takes a minute and a few MiB): N trace events in the ratio torch records them
(alloc, free_requested, free_completed, and a segment_alloc now and then), each with a stack of
FRAMES frames drawn from STACKS stacks (one user frame each, the rest library and C++ frames
from a pool of 600), addresses, sizes, streams and times as a training step has them, then
SEGMENTS segments with their blocks. `pickle.load` reads the result like any snapshot.

--shared-lists gives events with one stack one frames list (as a snapshot built in Python from
shared lists would be): a memo reference per event instead of one per frame, so about 45 bytes
an event instead of 210, the shape of the benchmark's earlier figures.
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
from pathlib import Path
from typing import BinaryIO

_BATCH = 1000  # items per APPENDS / SETITEMS, as the pickler writes them


class _Writer:
    """Writes pickle opcodes, memoizing as the C pickler does (MEMOIZE after each container and
    string, references with BINGET / LONG_BINGET)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.memo_size = 0
        self.strings: dict[str, bytes] = {}

    def write(self, data: bytes) -> None:
        self.out.write(data)

    def memoize(self) -> int:
        self.write(b"\x94")
        self.memo_size += 1
        return self.memo_size - 1

    @staticmethod
    def get(index: int) -> bytes:
        return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)

    def string(self, text: str) -> bytes:
        """The bytes that put `text` on the stack: inline and memoized the first time, then a
        reference."""
        known = self.strings.get(text)
        if known is not None:
            return known
        raw = text.encode()
        head = b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + struct.pack("<I", len(raw))
        self.write(head + raw)
        self.strings[text] = self.get(self.memoize())
        return b""  # already written

    def put_string(self, text: str) -> None:
        self.write(self.string(text))

    @staticmethod
    def integer(value: int) -> bytes:
        if 0 <= value < 256:
            return b"K" + bytes([value])
        if 0 <= value < 65536:
            return b"M" + struct.pack("<H", value)
        if -(2**31) <= value < 2**31:
            return b"J" + struct.pack("<i", value)
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw


def _frame_pool(count: int, rng: random.Random) -> list[dict[str, object]]:
    pool: list[dict[str, object]] = []
    for i in range(count):
        if i % 3 == 0:
            pool.append({"name": f"at::native::kernel_{i}(at::Tensor const&)", "filename": "??", "line": 0})
        elif i % 3 == 1:
            pool.append({"name": f"forward_{i}", "line": 100 + i,
                         "filename": f"/usr/lib/python3/site-packages/torch/nn/modules/mod_{i}.py"})
        else:
            pool.append({"name": f"c10::impl::call_{i}", "filename": "RegisterCUDA.cpp", "line": 0})
    rng.shuffle(pool)
    return pool


def write_snapshot(out: BinaryIO, events: int, frames: int = 36, stacks: int = 256,
                   segments: int = 200, seed: int = 0, shared_lists: bool = False) -> None:
    rng = random.Random(seed)
    w = _Writer(out)
    w.write(b"\x80\x04")  # PROTO 4 (no FRAME opcodes: optional, and the unpickler reads either)
    w.write(b"}")
    w.memoize()
    w.write(b"(")
    pool = _frame_pool(600, rng)
    user = [{"name": f"layer_{s}", "filename": f"/home/user/model/train_{s % 17}.py", "line": 10 + s}
            for s in range(stacks)]
    stack_frames = []
    for s in range(stacks):
        chosen = rng.sample(pool, frames - 1)
        chosen.insert(rng.randrange(frames // 2, frames), user[s])
        stack_frames.append(chosen)
    frame_refs: dict[int, bytes] = {}  # id(frame) -> its reference, once written
    list_refs: dict[int, bytes] = {}  # id(stack) -> its list's reference, with --shared-lists

    def put_frames(chosen: list[dict[str, object]], share: bool = False) -> None:
        if share and id(chosen) in list_refs:
            w.write(list_refs[id(chosen)])
            return
        w.write(b"]")
        index = w.memoize()
        if share:
            list_refs[id(chosen)] = w.get(index)
        if chosen:
            w.write(b"(")
            for frame in chosen:
                ref = frame_refs.get(id(frame))
                if ref is None:
                    w.write(b"}")
                    index = w.memoize()
                    w.write(b"(")
                    for key in ("name", "filename", "line"):
                        w.put_string(key)
                        value = frame[key]
                        if isinstance(value, str):
                            w.put_string(value)
                        else:
                            w.write(w.integer(int(value)))
                    w.write(b"u")
                    ref = frame_refs[id(frame)] = w.get(index)
                else:
                    w.write(ref)
            w.write(b"e")

    def put_dict_items(items: list[tuple[str, object]]) -> None:
        w.write(b"}")
        w.memoize()
        w.write(b"(")
        for key, value in items:
            w.put_string(key)
            if isinstance(value, str):
                w.put_string(value)
            elif isinstance(value, bool):
                w.write(b"\x88" if value else b"\x89")
            elif isinstance(value, int):
                w.write(w.integer(value))
            elif isinstance(value, list):
                put_frames(value, shared_lists and items[0][0] == "action")
            else:
                raise TypeError(type(value))
        w.write(b"u")

    # segments: SEGMENTS segments of 20 MiB, each with a few blocks
    w.put_string("segments")
    w.write(b"]")
    w.memoize()
    base = 0x7F0000000000
    if segments:
        w.write(b"(")
        for s in range(segments):
            address = base + s * (20 << 20)
            blocks = []
            offset = 0
            for b in range(4):
                size = (5 << 20) if b < 3 else (20 << 20) - offset
                state = "active_allocated" if (s + b) % 3 else "inactive"
                blocks.append((address + offset, size, state, stack_frames[(s * 4 + b) % stacks]))
                offset += size
            allocated = sum(size for _, size, state, _ in blocks if state == "active_allocated")
            # Written by hand: the blocks list holds dicts, each with its own frames list.
            w.write(b"}")
            w.memoize()
            w.write(b"(")
            for key, value in (("device", 0), ("address", address), ("total_size", 20 << 20),
                               ("allocated_size", allocated), ("active_size", allocated),
                               ("requested_size", allocated), ("stream", 0)):
                w.put_string(key)
                w.write(w.integer(value))
            w.put_string("segment_type")
            w.put_string("large")
            w.put_string("is_expandable")
            w.write(b"\x89")
            w.put_string("blocks")
            w.write(b"]")
            w.memoize()
            w.write(b"(")
            for block_address, size, state, chosen in blocks:
                put_dict_items([("address", block_address), ("size", size), ("requested_size", size),
                                ("state", state), ("frames", chosen if state != "inactive" else [])])
            w.write(b"e")
            w.put_string("frames")
            put_frames(stack_frames[s % stacks])
            w.write(b"u")
            if s % _BATCH == _BATCH - 1 and s + 1 < segments:
                w.write(b"e(")
        w.write(b"e")

    # device_traces: one device. Each allocation is followed, some events later, by its
    # free_requested and free_completed; a segment_alloc comes before every 8th allocation.
    w.put_string("device_traces")
    w.write(b"]")
    w.memoize()
    w.write(b"]")
    w.memoize()
    written = 0
    pending: list[tuple[int, int, int]] = []  # (address, size, stack) allocated, not yet freed
    time_us = 1_748_730_219_000_000
    in_batch = 0
    next_address = base + (segments + 1) * (20 << 20)
    while written < events:
        if in_batch == 0:
            w.write(b"(")
        if pending and (len(pending) > 64 or rng.random() < 0.45):
            address, size, stack = pending.pop(rng.randrange(len(pending)))
            for action in ("free_requested", "free_completed"):
                if written >= events:
                    break
                put_dict_items([("action", action), ("addr", address), ("size", size), ("stream", 0),
                                ("time_us", time_us), ("frames", stack_frames[stack])])
                written += 1
                in_batch += 1
                time_us += rng.randrange(1, 40)
        elif written % 8 == 7:
            put_dict_items([("action", "segment_alloc"), ("addr", next_address), ("size", 20 << 20),
                            ("stream", 0), ("time_us", time_us), ("frames", stack_frames[written % stacks])])
            written += 1
            in_batch += 1
        else:
            size = 512 * rng.randrange(1, 1 << rng.randrange(1, 15))
            stack = rng.randrange(stacks)
            address = next_address
            next_address += (size + 511) // 512 * 512
            put_dict_items([("action", "alloc"), ("addr", address), ("size", size), ("stream", 0),
                            ("time_us", time_us), ("frames", stack_frames[stack])])
            pending.append((address, size, stack))
            written += 1
            in_batch += 1
            time_us += rng.randrange(1, 40)
        if in_batch >= _BATCH or written >= events:
            w.write(b"e")
            in_batch = 0
    w.write(b"a")  # the one device's trace into device_traces

    w.put_string("allocator_settings")
    put_dict_items([("PYTORCH_CUDA_ALLOC_CONF", "synthetic"), ("max_split_size", 2**31 - 1),
                    ("expandable_segments", False)])
    w.write(b"u.")  # SETITEMS into the snapshot, STOP


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--events", type=int, required=True, help="trace events")
    parser.add_argument("--frames", type=int, default=36, help="frames per stack (36: the 2.7B trace's mean)")
    parser.add_argument("--stacks", type=int, default=256, help="distinct stacks")
    parser.add_argument("--segments", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shared-lists", action="store_true", help="one frames list per stack, shared by events")
    args = parser.parse_args()
    with args.out.open("wb") as out:
        write_snapshot(out, args.events, args.frames, args.stacks, args.segments, args.seed, args.shared_lists)
    print(f"{args.out}: {args.events:,} events, {args.out.stat().st_size / 2**20:,.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
