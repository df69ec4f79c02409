"""Peak memory and time of `stowage inspect` against the snapshot's size, on synthetic snapshots.

    bench/inspect/memory_ratio.py [--mib 40 250 1000] [--repeat 3] [--shared-lists]
                                  [--tile SNAPSHOT [--tile-key KEY]] [--dir /tmp] [--cap-gib 16] [--smoke]

For each size, writes a snapshot of about that many MiB in the shape stock PyTorch writes
(bench/inspect/synthetic_snapshot.py: trace events with 36-frame stacks whose frames are memo
references, segments with blocks), runs `stowage inspect SNAPSHOT --json` on it REPEAT times,
each in a fresh process under an address-space limit of CAP GiB, and prints the medians of the
wall time and of the process's peak resident memory (Python, numpy and the mapped file
included), its ratio to the file, and the ratio of what it takes beyond the first row to the
file. The first row is a snapshot of one event: what the interpreter and the imports take. The
snapshots are deleted afterwards. --smoke: one small snapshot, once (a check that the benchmark
runs). --shared-lists: events share whole frames lists (four times as many events per MiB).
--tile SNAPSHOT: each snapshot is a real trace repeated instead (of SNAPSHOT, or of its entry
--tile-key where it holds several, as bench/traces/h200-advice's); one where the advice's rules
fire makes the inspector categorise every allocation.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_snapshot import write_snapshot  # noqa: E402


def measure(path: Path, cap: int) -> tuple[float, int]:
    """One `stowage inspect --json` run: (seconds, peak resident bytes)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "stowage", "inspect", str(path), "--json"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit)
    assert child.stderr is not None
    error = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"stowage inspect {path} failed ({child.returncode}): {error.decode(errors='replace')}")
    return seconds, usage.ru_maxrss * 1024


def tiled(source: Path, key: str, mib: float, out: Path) -> int:
    """Writes a snapshot of about `mib` MiB: `source`'s first device trace (a real one, a whole
    number of times: each copy frees what it allocates) repeated, its frames shared as torch
    shares them. Returns the events written."""
    import gzip
    import pickle

    data = source.read_bytes()
    snapshot = pickle.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    if "device_traces" not in snapshot:  # a {"name": snapshot} collection
        snapshot = snapshot[key] if key else next(iter(snapshot.values()))
    trace = snapshot["device_traces"][0]
    once = len(pickle.dumps(trace, protocol=4))
    copies = max(1, int(mib * 2**20 / once))
    events = [dict(event) for _ in range(copies) for event in trace]  # (frames lists shared, as torch's)
    out.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4))
    return len(events)


def events_for(mib: float, shared_lists: bool, folder: Path) -> int:
    """Events that make a snapshot of about `mib` MiB (measured on a small one)."""
    sizes = []
    for events in (20_000, 40_000):
        sample = folder / f"sample_{events}.pickle"
        with sample.open("wb") as out:
            write_snapshot(out, events, shared_lists=shared_lists)
        sizes.append(sample.stat().st_size)
        sample.unlink()
    per_event = (sizes[1] - sizes[0]) / 20_000
    return max(1, int((mib * 2**20 - (sizes[0] - 20_000 * per_event)) / per_event))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, nargs="+", default=[40, 250, 1000], help="snapshot sizes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shared-lists", action="store_true", help="events share whole frames lists")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where snapshots are written")
    parser.add_argument("--cap-gib", type=float, default=16, help="address-space limit of each run")
    parser.add_argument("--smoke", action="store_true", help="one 2 MiB snapshot, once")
    parser.add_argument("--tile", type=Path, help="a real snapshot whose trace is repeated to each size instead")
    parser.add_argument("--tile-key", default="", help="the entry of --tile's collection of snapshots")
    args = parser.parse_args()
    if args.smoke:
        args.mib, args.repeat = [2], 1
    cap = int(args.cap_gib * 2**30)
    print("| events | file | inspect (median) | peak resident (median) | resident / file | beyond one event / file |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    base = 0.0
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for mib in [0.0, *args.mib]:
            path = Path(folder) / f"synthetic_{mib:g}.pickle"
            if args.tile is not None and mib:
                events = tiled(args.tile, args.tile_key, mib, path)
            else:
                events = events_for(mib, args.shared_lists, Path(folder)) if mib else 1
                with path.open("wb") as out:
                    write_snapshot(out, events, segments=200 if mib else 0, shared_lists=args.shared_lists)
            size = path.stat().st_size
            runs = [measure(path, cap) for _ in range(args.repeat)]
            path.unlink()
            seconds = statistics.median(run[0] for run in runs)
            peak = statistics.median(run[1] for run in runs)
            ratios = f"{peak / size:.2f} | {(peak - base) / size:.2f}" if mib else "- | -"
            base = base or peak
            print(f"| {events:,} | {size / 2**20:,.1f} MiB | {seconds:.1f} s | {peak / 2**20:,.0f} MiB | {ratios} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
