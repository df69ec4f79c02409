"""``stowage record``: run a PyTorch script under stowage and keep its memory history.

    stowage record [--capacity 8GiB] [-o snapshot.pickle] [--stacks python|all] -- python train.py ARGS

The script runs in this process, with stowage as torch's CPU allocator over a simulated device
of ``--capacity`` (CPU mode) and history recording on; when it ends (normally, by exception, or
by sys.exit), the snapshot is written: segments, blocks and every alloc, free and segment event
with its stack, in torch's snapshot format. ``stowage replay`` and ``torch.cuda._memory_viz``
read it. ``-m module`` runs a module instead of a script.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import stowage


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name, help="run a script under stowage's CPU mode and write its memory snapshot",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", default="16GiB", help="simulated device size (default 16GiB)")
    parser.add_argument("-o", "--output", default="stowage_snapshot.pickle", help="snapshot file")
    parser.add_argument("--stacks", choices=("python", "all"), default="python")
    parser.add_argument("--config", default="", help="allocator configuration, key:value,...")
    parser.add_argument("--no-tags", action="store_true",
                        help="do not note what each allocation is (stowage.tagging): for a loop whose backward "
                             "uses create_graph=True")
    parser.add_argument("target", nargs=argparse.REMAINDER, help="-- [python] script.py ARGS | -m module ARGS")


def _target(command: list[str]) -> tuple[str, str, list[str]]:
    """('path' or 'module', what, argv) from `-- python script.py args`."""
    if command and command[0] == "--":
        command = command[1:]
    if command and Path(command[0]).name.startswith("python"):
        command = command[1:]
    if len(command) >= 2 and command[0] == "-m":
        return "module", command[1], command[1:]
    if not command:
        raise SystemExit("stowage record: give the script to run: stowage record -- python script.py")
    return "path", command[0], command


def run(args: argparse.Namespace) -> int:
    kind, target, argv = _target(args.target)
    if kind == "path" and not os.path.exists(target):
        print(f"stowage record: {target}: no such script", file=sys.stderr)
        return 2
    stowage.enable(args.config, device="cpu", capacity=args.capacity)
    stowage.record_history(True, stacks=args.stacks, tags=not args.no_tags)
    saved_argv = sys.argv
    sys.argv = argv
    status = 0
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(Path(target).resolve().parent))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv = saved_argv
        stowage.dump_snapshot(args.output)
        events = len(stowage.snapshot()["device_traces"][0])
        print(f"stowage record: {events:,} events, peak {stowage.format_bytes(stowage.max_memory_allocated())} "
              f"allocated; snapshot written to {args.output}", file=sys.stderr)
    return status
