"""Peak memory of `stowage inspect` against the snapshot's file size, on a synthetic snapshot.

    bench/inspect/memory_ratio.py [--events 1000000] [--frames 6]

Writes a snapshot whose trace holds EVENTS alloc/free_completed pairs, each with FRAMES stack
frames (PyTorch's snapshots share frame dicts between events with one stack; this one shares
them among 64 stacks), then runs `stowage inspect --json` on it in a child process and prints
the file size, the child's peak resident memory and their ratio.
"""

from __future__ import annotations

import argparse
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def synthetic(events: int, frames: int) -> dict[str, object]:
    stacks = [[{"filename": f"/home/user/train_{s}.py", "line": 10 + f, "name": f"layer_{f}"}
               for f in range(frames)] for s in range(64)]
    trace = []
    for i in range(events):
        address = 0x7F0000000000 + (i % 4096) * (1 << 20)
        size = 512 * (1 + i % 2048)
        stack = stacks[i % 64]
        trace.append({"action": "alloc", "addr": address, "size": size, "stream": 0,
                      "time_us": i * 10, "frames": stack})
        trace.append({"action": "free_completed", "addr": address, "size": size, "stream": 0,
                      "time_us": i * 10 + 5, "frames": stack})
    return {"segments": [], "device_traces": [trace], "allocator_settings": {}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--frames", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "synthetic.pickle"
        path.write_bytes(pickle.dumps(synthetic(args.events, args.frames), protocol=4))
        size = path.stat().st_size
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "stowage", "inspect", str(path), "--json"], check=True,
                       stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(f"{2 * args.events:,} events, file {size / 2**20:.1f} MiB, inspect {seconds:.1f} s, "
          f"peak resident {peak / 2**20:.0f} MiB, ratio {peak / size:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
