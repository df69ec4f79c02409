"""Every reader of a file from elsewhere, on valid and hostile files of a chosen size: how long it
takes to read and validate (or refuse) a file, and the largest resident memory of the process
over the file's size, against the bounds of the issue "Hostile input, bounded resources, and no
stuck states": 10 s, and 200 MB plus 4 times the file for snapshots, 10 times for JSON.

    python3 bench/hostile/reader_bounds.py [--mib 20 100] [--only NAME] [--reader NAME] [--before DIR]
                                           [--limit SECONDS]

Each case runs in a fresh interpreter that imports the reader, then reads the file once: the
time is the reading's (a valid plan's solve is not counted: the readers are load_trace and
stowage.plan.load, not the solver), the memory the process's peak resident set (the interpreter
and its imports included). Prints a markdown table. --only keeps the cases whose file name holds
NAME, --reader those whose reader does; --before DIR also runs each case with the stowage package
found in DIR (a copy of an earlier install, say), on the same file, in a row after it; --limit
stops a reading after that many seconds (its peak is then not measured).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "inspect"))
sys.path.insert(0, str(REPO / "tests" / "python"))

from plan_files_fuzzer import small_profile  # noqa: E402
from synthetic_snapshot import write_snapshot  # noqa: E402

MB = 1_000_000
MiB = 1 << 20
READERS = {
    "inspect (columns)": ("from stowage.snapshot_reader import load_snapshot_columnar as read", 4),
    "load_snapshot": ("from stowage.snapshot_reader import load_snapshot as read", 4),
    "profile": ("from stowage.plan import load_trace as read", 10),
    "plan": ("from stowage.plan import load as read", 10),
}


def measure(reader: str, path: Path, before: str | None = None, limit: float = 3600) -> dict[str, object]:
    code = textwrap.dedent(f"""
        import json, sys, time
        {READERS[reader][0]}
        from stowage.validation import InputError
        start = time.perf_counter()
        try:
            read({str(path)!r})
            outcome = "read"
        except InputError as error:
            outcome = "refused: " + str(error)[len({str(path)!r}) + 2:][:90]
        seconds = time.perf_counter() - start
        # VmHWM: this process's own peak (ru_maxrss keeps the parent's across fork and exec)
        peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) * 1024
        print(json.dumps({{"outcome": outcome, "seconds": seconds, "peak": peak}}))
    """)
    environment = dict(os.environ, PYTHONPATH=before + os.pathsep + os.environ.get("PYTHONPATH", "")) if before else None
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit,
                              env=environment, cwd=before or None)
    except subprocess.TimeoutExpired:
        return {"outcome": f"stopped after {limit:g} s", "seconds": limit, "peak": 0}
    if done.returncode != 0:
        return {"outcome": "crashed: " + done.stderr.strip().splitlines()[-1][:90], "seconds": 0.0, "peak": 0}
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- files ---


def flood(opcode: bytes, first: bytes = b"") -> Callable[[Path, int], None]:
    def write(path: Path, size: int) -> None:
        path.write_bytes(b"\x80\x04" + first + opcode * (size // len(opcode)) + b".")
    return write


def dense_events(path: Path, size: int) -> None:
    """A valid snapshot of the smallest events a pickle holds (16 bytes each)."""
    events = [{"action": "alloc", "addr": i % 200, "size": 1} for i in range(size // 16)]
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4))


def torch_shaped(path: Path, size: int) -> None:
    with path.open("wb") as out:
        write_snapshot(out, events=size // 210)


def read_whole_layout(path: Path, size: int) -> None:
    """Torch's events with one event written twice: the columnar reader reads such a pickle again
    whole, as plain data."""
    events = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": i,
               "frames": [{"filename": "/src/train.py", "line": i % 50, "name": "step"}]} for i in range(size // 90)]
    events.append(events[0])
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4))


def fitted(snapshot: Callable[[int], dict[str, object]]) -> Callable[[Path, int], None]:
    """A file of `snapshot(n)` pickled, n chosen so that it comes to about `size` bytes."""
    def write(path: Path, size: int) -> None:
        small, large = (len(pickle.dumps(snapshot(n), protocol=4)) for n in (2000, 4000))
        each = (large - small) / 2000
        path.write_bytes(pickle.dumps(snapshot(max(1, int((size - (small - 2000 * each)) / each))), protocol=4))
    return write


_FRAMES = [{"filename": f"/src/f{i}.py", "line": i, "name": "step"} for i in range(2000)]
# One frames list of 2,000 frames, a segment's, that every event holds: a memo bomb through the
# events (each stands for its frames) that the columns store once.
shared_frames = fitted(lambda n: {"segments": [{"address": 0, "total_size": 1, "frames": _FRAMES}],
                                  "device_traces": [[{"action": "alloc", "addr": i % 256, "size": 1, "frames": _FRAMES}
                                                     for i in range(n)]]})
# Events of 40 fields the columns do not keep: read again as dicts.
many_fields = fitted(lambda n: {"device_traces": [[dict({f"k{j}": j for j in range(40)}, action="alloc", addr=i % 256,
                                                        size=1) for i in range(n)]]})
# device_free on every event: the columns' dict of rare fields as large as it gets.
device_free_each = fitted(lambda n: {"device_traces": [[{"action": "oom", "size": 1, "device_free": i % 256}
                                                        for i in range(n)]]})


def traces_flood(path: Path, size: int) -> None:
    """device_traces of empty traces, one a byte."""
    path.write_bytes(b"\x80\x04}\x94(\x8c\rdevice_traces\x94]\x94(" + b"]" * (size - 40) + b"eu.")


def text_lines(path: Path, size: int) -> None:
    """Protocol 0's INT lines of 4,000 digits, each parsed as Python's int() parses them."""
    line = b"I" + b"0" * 4000 + b"1\n"
    path.write_bytes(b"(" + line * (size // len(line)) + b"l.")


def gzip_bomb(path: Path, size: int) -> None:
    """A gzip file that expands to `size` (about 1,000 times its own), written without holding
    its expansion."""
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(b"\x80\x04]")
        zeros = bytes(1 << 20)
        for _ in range(size // len(zeros)):
            out.write(zeros)


def concatenated(path: Path, size: int) -> None:
    one = pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 2}]]}, protocol=4)
    path.write_bytes(one + b"\x80\x04]" + b"]" * size + b".")


def big_profile(path: Path, size: int) -> None:
    blocks = max(1, size // 3500)  # about 3.5 KB of JSON a block of 4 ops and their tensors
    path.write_text(json.dumps(small_profile(blocks=blocks, per=4)))


def big_plan(path: Path, size: int) -> None:
    profile = small_profile(blocks=max(1, size // 3500), per=4)
    path.write_text(json.dumps({"format": "stowage-plan", "version": 1, "budget": 1 << 30,
                                "decisions": ["keep"] * len(profile["tensors"]), "profile": profile}))


def json_filler(item: str, opening: str = '{"format": "stowage-lifetimes", "version": 1, "ops": [',
                closing: str = "]}") -> Callable[[Path, int], None]:
    def write(path: Path, size: int) -> None:
        count = size // (len(item.replace("#", "00000000")) + 1)
        path.write_text(opening + ",".join(item.replace("#", f"{i:08x}") for i in range(count)) + closing)
    return write


CASES: list[tuple[str, str, Callable[[Path, int], None]]] = [
    ("inspect (columns)", "torch-shaped snapshot (valid)", torch_shaped),
    ("inspect (columns)", "densest valid events (16 B each)", dense_events),
    ("inspect (columns)", "one event twice: read whole", read_whole_layout),
    ("inspect (columns)", "EMPTY_LIST flood", flood(b"]")),
    ("inspect (columns)", "EMPTY_DICT flood", flood(b"}")),
    ("inspect (columns)", "MARK flood", flood(b"(")),
    ("inspect (columns)", "TUPLE1 flood", flood(b")N\x85")),
    ("inspect (columns)", "a pickle, then a flood", concatenated),
    ("inspect (columns)", "gzip bomb (size: its expansion)", gzip_bomb),
    ("inspect (columns)", "a frames list every event holds", shared_frames),
    ("inspect (columns)", "events of 40 fields", many_fields),
    ("inspect (columns)", "device_free on every event", device_free_each),
    ("inspect (columns)", "device_traces of empty traces", traces_flood),
    ("inspect (columns)", "GET flood (one value, memoized)", flood(b"h\x00", b"N\x94")),
    ("inspect (columns)", "text lines of 4,000 digits", text_lines),
    ("load_snapshot", "torch-shaped snapshot (valid)", torch_shaped),
    ("load_snapshot", "densest valid events (16 B each)", dense_events),
    ("load_snapshot", "one event twice: read whole", read_whole_layout),
    ("load_snapshot", "EMPTY_LIST flood", flood(b"]")),
    ("load_snapshot", "a frames list every event holds", shared_frames),
    ("profile", "valid profile", big_profile),
    ("profile", "strings at the density bounds", json_filler('"abcdefgh"')),
    ("profile", "integers at the density bounds", json_filler("10000000")),
    ("profile", "distinct keys at the density bounds", json_filler('"#abc":0', '{"format": "stowage-lifetimes", ', "}")),
    ("profile", "empty lists", json_filler("[]")),
    ("profile", "nesting past json's limit", lambda path, size: path.write_text("[ " * 3000 + " " * size + " ]" * 3000)),
    ("plan", "valid plan", big_plan),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, nargs="+", default=[20, 100])
    parser.add_argument("--only", help="run only the cases whose file name holds this")
    parser.add_argument("--reader", help="run only the cases whose reader holds this")
    parser.add_argument("--before", help="also run each case with the stowage package in this folder")
    parser.add_argument("--limit", type=float, default=3600, help="stop a reading after this many seconds")
    args = parser.parse_args()
    print("| reader | file | size | outcome | time | peak resident | bound | peak / size |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as folder:
        for mib in args.mib:
            for reader, name, write in CASES:
                if (args.only and args.only not in name) or (args.reader and args.reader not in reader):
                    continue
                path = Path(folder) / "input"
                write(path, int(mib * MiB))
                stored = path.stat().st_size
                held_to = 64 * stored if name.startswith("gzip") else stored  # gzip: the most it may expand to
                bound = 200 * MB + READERS[reader][1] * held_to
                shown = f"{stored / MiB:,.1f} MiB" + (f" ({mib:g} MiB expanded)" if held_to != stored else "")
                for label, package in (("", None), (" (before)", args.before)):
                    if label and not package:
                        continue
                    result = measure(reader, path, package, args.limit)
                    peak = int(result["peak"])  # type: ignore[call-overload]
                    seconds = float(result["seconds"])  # type: ignore[arg-type]
                    ended = not str(result["outcome"]).startswith(("stopped", "crashed"))
                    mark = "" if ended and peak <= bound and seconds <= 10 else " **over**"
                    print(f"| {reader}{label} | {name} | {shown} | {result['outcome']} | {seconds:.2f} s | "
                          f"{peak / MiB:,.0f} MiB | {bound / MiB:,.0f} MiB | {peak / stored:.2f}{mark} |", flush=True)
                path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
