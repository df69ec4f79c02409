"""``stowage plan TRACE --budget SIZE``: a plan for a recorded step, without running it.

    stowage plan step.lifetimes.json --budget 6GiB          # decisions by module, predictions
    stowage plan step.lifetimes.json --budget 50% --json    # the same as one JSON object
    stowage plan step.lifetimes.json --budget 6GiB --save plan.json   # for stowage.plan.load
    stowage plan sized.lifetimes.json --budget 6GiB --at batch=8,seq=4096

TRACE is a lifetime trace file (``stowage.plan.profile(step).save(path)``, or one recorded at
several sizes, planned for the sizes ``--at`` names); the budget a size or a percentage of the
step's unconstrained peak. Exit status: 0 when the plan fits, 1 when none does, 2 for a file,
budget or size that cannot be read (README, "Planning keep / offload / recompute").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import Any

from stowage.byte_counts import byte_count
from stowage.plan import load_trace, solve
from stowage.plan.file_formats import MAX_TOTAL_BYTES
from stowage.plan.sizes import SizedTrace
from stowage.terminal import literal


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(name, help="keep, offload or recompute each saved tensor of a recorded step",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", metavar="TRACE", help="a lifetime trace file (stowage.plan.profile(...).save)")
    parser.add_argument("--budget", required=True,
                        help="device memory the step may add: a size (6GiB) or a percentage of its peak (50%%)")
    parser.add_argument("--at", metavar="NAME=N,...",
                        help="the sizes to plan for, for a sized trace (batch=8,seq=4096)")
    parser.add_argument("--exact", action="store_true", help="search exhaustively (small traces only)")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    parser.add_argument("--save", metavar="PLAN", help="write the plan, for stowage.plan.load")


def budget_bytes(text: str, unconstrained_peak: int) -> int:
    """A size, or a percentage of the unconstrained peak, from 1 byte to MAX_TOTAL_BYTES;
    ValueError naming what is wrong."""
    if text.endswith("%"):
        try:
            share = float(text[:-1]) / 100
        except ValueError:
            raise ValueError(f"the budget {text!r} is not a percentage") from None
        if not math.isfinite(share):
            raise ValueError(f"the budget {text!r} is not a finite percentage")
        if not 0 < share:
            raise ValueError(f"the budget {text!r} must be above 0%")
        budget = int(unconstrained_peak * share)
    else:
        budget = byte_count(int(text) if text.isdigit() else text, "--budget")
    if not 0 < budget <= MAX_TOTAL_BYTES:
        raise ValueError(f"the budget {text!r} is {budget:,} bytes; it must be positive and at most "
                         f"{MAX_TOTAL_BYTES:,} (64 PiB)")
    return budget


def parse_sizes(text: str) -> dict[str, int]:
    """``batch=8,seq=4096`` as a dict; ValueError naming what is wrong."""
    sizes = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if not name.strip() or not value.strip().isdigit() or len(value.strip()) > 10:
            raise ValueError(f"--at {text!r}: give sizes as name=number, comma separated (batch=8,seq=4096)")
        sizes[name.strip()] = int(value)
    return sizes


def run(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args.trace)
        if isinstance(trace, SizedTrace):
            if args.at is None:
                raise ValueError(f"{args.trace} was recorded at sizes {sorted(trace.sizes)}: "
                                 "name the sizes to plan for with --at, e.g. --at "
                                 + ",".join(f"{name}={max(points)}" for name, points in trace.sizes.items()))
            trace = trace.at(parse_sizes(args.at))
        elif args.at is not None:
            raise ValueError(f"{args.trace} was recorded at one size; --at is for a trace recorded at several")
        budget = budget_bytes(args.budget, trace.unconstrained_peak_bytes)
        with warnings.catch_warnings(record=True):  # "does not fit" is in the output and exit status
            warnings.simplefilter("always")
            plan = solve(trace, budget, exact=args.exact)
    except (OSError, ValueError) as error:  # InputError among them: the file, the field, the bound
        print(f"stowage plan: {literal(str(error))}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"stowage plan: {literal(args.trace)}: ran out of memory reading or planning it", file=sys.stderr)
        return 2
    if args.save:
        try:
            plan.save(args.save)
        except OSError as error:
            print(f"stowage plan: cannot write {literal(args.save)}: {error.strerror or error}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps({"budget_bytes": budget, "fits": plan.fits, "decisions": [d.name for d in plan.decisions],
                          "by_module": plan.bytes_by_module(), "outcomes": plan.outcomes()}))
    else:
        print("\n".join(literal(line) for line in str(plan).split("\n")))  # what a file put in it, literally
        if args.save:
            print(f"\nsaved the plan to {args.save}")
    return 0 if plan.fits else 1
