"""``stowage inspect``: what held the memory, from a PyTorch memory snapshot.

Reads a snapshot written by ``torch.cuda.memory._dump_snapshot`` or by stowage (through the safe
loader, which runs no code) and explains one device's memory in the terminal, as JSON, or with
``--html OUT`` also as one self-contained HTML file: totals and fragmentation, segments, allocation
sites by live bytes at the end and at the trace's peak, what the peak's bytes are and which module
made them, the trace's steps, advice, and for an ``oom`` event what would have helped (README:
"Inspecting a snapshot").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from stowage.inspection.findings import devices_with_data, inspect, report_of
from stowage.inspection.html import render, write as write_html
from stowage.inspection.text import bytes_text, print_report
from stowage.snapshot_reader import SnapshotError, load_snapshot_columnar
from stowage.terminal import console, literal


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name,
        help="explain what held the memory in a snapshot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("snapshot", metavar="SNAPSHOT", help="a snapshot pickle (.pickle, .pickle.gz)")
    parser.add_argument("--device", type=int, default=None, help="the device to explain (default: the first with data)")
    parser.add_argument("--top", type=int, default=10, help="allocation sites to list (default 10)")
    parser.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    parser.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report (plots and tables)")


def run(args: argparse.Namespace) -> int:
    err = console(stderr=True, soft_wrap=True)
    path = Path(args.snapshot)
    if args.top < 1:
        err.print("stowage inspect: --top must be at least 1")
        return 2
    try:
        snapshot = load_with_progress(path, err, getattr(args, "command_line", None))
    except SnapshotError as error:
        err.print(f"stowage inspect: {literal(str(error))}")
        return 2
    devices = devices_with_data(snapshot)
    if args.device is not None:
        if args.device not in devices:
            err.print(f"stowage inspect: {literal(str(path))}: device {args.device} has no data "
                      f"(devices with data: {', '.join(map(str, devices)) or 'none'})")
            return 2
        devices = [args.device]
    if not devices:
        err.print(f"stowage inspect: {literal(str(path))}: the snapshot holds no segments and no trace events")
        return 2
    try:
        found, trace = inspect(snapshot, devices[0], args.top, timelines=bool(args.html))
        report = report_of(snapshot, devices[0], found, trace)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        err.print(f"stowage inspect: {literal(str(path))}: malformed snapshot ({type(error).__name__}: "
                  f"{literal(str(error))})")
        return 2
    report["path"] = str(path)
    if args.html:
        try:
            page = render(path.name, report, snapshot, found)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
            err.print(f"stowage inspect: {literal(str(path))}: cannot draw the report ({type(error).__name__}: "
                      f"{literal(str(error))})")
            return 2
        try:
            write_html(page, args.html)
        except (OSError, UnicodeError) as error:
            err.print(f"stowage inspect: cannot write {literal(args.html)}: {literal(str(error))}")
            return 2
        err.print(f"stowage inspect: wrote {literal(args.html)} ({bytes_text(Path(args.html).stat().st_size)})")
    if args.json:
        print(json.dumps(report))
    else:
        out = console()
        print_report(path, report, found, out if out.is_terminal else console(width=160))
    return 0


def load_with_progress(path: Path, console: Console, command: str | None = None) -> dict[str, Any]:
    """load_snapshot_columnar, with a progress bar per phase on a terminal (`command`: the command
    line reading it, for a refusal's message)."""
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        tasks: dict[str, Any] = {}

        def report(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(f"{phase} {literal(path.name)}", total=max(total, 1))
            progress.update(tasks[phase], completed=done)

        return load_snapshot_columnar(path, report if console.is_terminal else None, command)
