#!/usr/bin/env python3
"""Checks that stowage's dependencies point one way (README, "Layout").

Each C++ source folder is a layer; a layer may include and link only the layers below it:

    base  <-  device  <-  allocator  <-  process  <-  libtorch  <-  torch bindings
      ^                        ^  <-  offload  <-  planner              ^ (offload too)
      ^                        ^  <-  core bindings (planner and snapshot too)
      ^  <-  snapshot (the snapshot reader: nothing of the allocator's)

(device/host and device/cuda are the two devices inside the device layer and never include each
other.) Two things are checked: every ``#include "..."`` of a file in a layer names a file of its
own layer or of one it may depend on, and every ``target_link_libraries`` of a layer's target
names only targets it may depend on. tests/, bench/ and tools/ sit on top and are not checked.

    python3 tools/check_layering.py [ROOT]

Prints each violation as ``file:line: what`` and exits 1 if there is any.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

# Folder -> layer, longest prefix first.
LAYERS: dict[str, str] = {
    "allocator/base": "base",
    "allocator/device/host": "host device",
    "allocator/device/cuda": "cuda device",
    "allocator/device": "device",
    "allocator/process": "process",
    "allocator": "allocator",
    "offload": "offload",
    "planner": "planner",
    "snapshot": "snapshot",
    "python/libtorch": "libtorch",
    "python/bindings/torch": "torch bindings",
    "python/bindings": "core bindings",
}

# Layer -> the layers it depends on directly; what they depend on is allowed too.
DIRECT: dict[str, set[str]] = {
    "base": set(),
    "device": {"base"},
    "host device": {"device"},
    "cuda device": {"device"},
    "allocator": {"device", "host device"},  # replay runs on the simulated device
    "process": {"allocator", "cuda device"},
    "offload": {"allocator"},
    "planner": {"base"},
    "libtorch": {"process"},
    "torch bindings": {"libtorch", "offload", "host device"},  # CPU mode
    "snapshot": {"base"},
    "core bindings": {"allocator", "planner", "snapshot"},
}

# CMake target -> its layer.
TARGETS: dict[str, str] = {
    "stowage_base": "base",
    "stowage_device": "device",
    "stowage_allocator": "allocator",
    "stowage_process": "process",
    "stowage_offload": "offload",
    "stowage_offload_objects": "offload",
    "stowage_planner": "planner",
    "stowage_snapshot": "snapshot",
    "stowage_torch": "libtorch",
    "_torch": "torch bindings",
    "_core": "core bindings",
}

SOURCES = (".cpp", ".hpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LINK = re.compile(r"target_link_libraries\(\s*(\S+)([^)]*)\)", re.S)


@dataclass(frozen=True)
class Violation:
    where: str
    what: str


def layer_of(path: str) -> str | None:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if path == prefix or path.startswith(prefix + "/"):
            return LAYERS[prefix]
    return None


def allowed(layer: str) -> set[str]:
    """The layer itself and every layer below it."""
    seen = {layer}
    stack = [layer]
    while stack:
        for below in DIRECT[stack.pop()]:
            if below not in seen:
                seen.add(below)
                stack.append(below)
    return seen


def check_includes(root: Path) -> list[Violation]:
    found: list[Violation] = []
    for prefix in LAYERS:
        for path in sorted((root / prefix).rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            relative = path.relative_to(root).as_posix()
            layer = layer_of(relative)
            assert layer is not None
            if layer != LAYERS[prefix]:
                continue  # counted under its own, longer prefix
            text = path.read_text(errors="replace")
            for match in INCLUDE.finditer(text):
                target = layer_of(match.group(1))
                if target is None or target in allowed(layer):
                    continue
                line = text.count("\n", 0, match.start()) + 1
                found.append(Violation(f"{relative}:{line}",
                                       f"{layer} includes {match.group(1)} of {target}"))
    return found


def check_links(root: Path) -> list[Violation]:
    found: list[Violation] = []
    for prefix in LAYERS:
        cmake = root / prefix / "CMakeLists.txt"
        if not cmake.is_file():
            continue
        text = cmake.read_text()
        for match in LINK.finditer(text):
            target, arguments = match.group(1), match.group(2)
            if target not in TARGETS:
                continue
            layer = TARGETS[target]
            for name in re.findall(r"[\w:]+", arguments):
                below = TARGETS.get(name)
                if below is None or below in allowed(layer):
                    continue
                line = text.count("\n", 0, match.start()) + 1
                where = f"{cmake.relative_to(root).as_posix()}:{line}"
                found.append(Violation(where, f"{target} ({layer}) links {name} ({below})"))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    violations = check_includes(root) + check_links(root)
    for violation in violations:
        print(f"{violation.where}: {violation.what}")
    if violations:
        print(f"check_layering: {len(violations)} dependencies point against the layers")
        return 1
    print("check_layering: every include and link points down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
