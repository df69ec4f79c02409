#!/usr/bin/env python3
"""Checks the size rules of README's "How the code is kept": no function over 80 lines and no
file over 800 lines in stowage's sources (the C++ layers, the bindings and the Python package),
except the functions listed in EXCEPTIONS, each with the reason it stays whole.

    python3 tools/check_code_size.py [ROOT]

Function lengths are lizard's (first to last line, comments included). Prints each breach as
``file:line: what`` and exits 1 if there is any.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import lizard
except ImportError:  # tools/requirements.txt installs it; a bare GPU machine may lack it
    print("check_code_size: lizard is not installed (pip install lizard); skipped")
    sys.exit(77)

MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 800
FOLDERS = ("base", "device", "allocator", "offload", "planner", "snapshot", "python/bindings", "python/libtorch",
           "python/tensors", "python/stowage")
SUFFIXES = (".cpp", ".hpp", ".h", ".cu", ".py")

# (file, function) -> why it is longer than MAX_FUNCTION_LINES. (The snapshot reader's Python
# opcode loop was the one; its C++ machine, snapshot/machine*.cpp, keeps within the rule.)
EXCEPTIONS: dict[tuple[str, str], str] = {}


def sources(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder in FOLDERS:
        found += [path for path in (root / folder).rglob("*")
                  if path.suffix in SUFFIXES and path.is_file()]
    return sorted(found)


def breaches(root: Path) -> list[str]:
    out: list[str] = []
    for path in sources(root):
        relative = path.relative_to(root).as_posix()
        text = path.read_text(errors="replace")
        lines = text.count("\n")
        if lines > MAX_FILE_LINES:
            out.append(f"{relative}:1: {lines} lines (at most {MAX_FILE_LINES})")
        analysis = lizard.analyze_file.analyze_source_code(str(path), text)
        for function in analysis.function_list:
            if function.length <= MAX_FUNCTION_LINES:
                continue
            if (relative, function.name) in EXCEPTIONS:
                continue
            out.append(f"{relative}:{function.start_line}: {function.name} has {function.length} "
                       f"lines (at most {MAX_FUNCTION_LINES})")
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    found = breaches(root)
    for breach in found:
        print(breach)
    if found:
        print(f"check_code_size: {len(found)} functions or files over the size rules")
        return 1
    print(f"check_code_size: {len(sources(root))} files within {MAX_FILE_LINES} lines, their "
          f"functions within {MAX_FUNCTION_LINES} ({len(EXCEPTIONS)} listed exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
