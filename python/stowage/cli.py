"""The ``stowage`` command: one module per subcommand, each with ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from stowage import __version__, demo, diff, doctor, inspector, record, replay
from stowage.plan import command as plan_command

SUBCOMMANDS = {
    "inspect": inspector,
    "diff": diff,
    "doctor": doctor,
    "replay": replay,
    "record": record,
    "plan": plan_command,
    "demo": demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stowage", description="Memory tools for training PyTorch models on one GPU."
    )
    parser.add_argument("--version", action="version", version=f"stowage {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, title="commands")
    for name, module in SUBCOMMANDS.items():
        module.add_parser(commands, name)
    args = parser.parse_args(argv)
    # as the user typed it, for messages that say what to run instead (a snapshot's memory ceiling)
    args.command_line = shlex.join(["stowage", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(SUBCOMMANDS[args.command].run(args))
    except KeyboardInterrupt:
        print("stowage: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # the readers bound what a file may cost; this is the machine's own limit
        print(f"stowage {args.command}: ran out of memory", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
