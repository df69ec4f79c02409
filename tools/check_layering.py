#!/usr/bin/env python3
"""Checks that stowage's dependencies point one way (README, "Layout").

Each C++ source folder is a layer; a layer may include and link only the layers below it:

    base  <-  device  <-  allocator  <-  process  <-  libtorch  <-  torch bindings
      ^                        ^  <-  offload  <-----------------------------'
      ^                        ^  <-  core bindings (planner and snapshot too)
      ^  <-  planner (the step's model: nothing of the allocator's or the engine's)
      ^  <-  snapshot (the snapshot reader: nothing of the allocator's)

(device/host and device/cuda are the two devices inside the device layer and never include each
other.) Four things are checked:
- every ``#include "..."`` of a file in a layer names a file of its own layer or of one it may
  depend on;
- every ``target_link_libraries`` of a layer's target names only targets it may depend on;
- each target declares the layers it uses and no other: a layer it links is one its sources
  include, and a layer they include is one it links (or one below a layer it links);
- the Python package has no import circle (tools/python_imports.py says what counts).
tests/, bench/ and tools/ sit on top and are not checked.

    python3 tools/check_layering.py [ROOT]

Prints each violation as ``file:line: what`` and exits 1 if there is any.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import python_imports

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

# A layer whose target's sources span the layers inside its folder too.
SPANS: dict[str, set[str]] = {"device": {"device", "host device", "cuda device"}}

# CMake target -> its layer.
TARGETS: dict[str, str] = {
    "stowage_base": "base",
    "stowage_device": "device",
    "stowage_allocator": "allocator",
    "stowage_process": "process",
    "stowage_offload": "offload",
    "stowage_offload_objects": "offload",
    "stowage_planner": "planner",
    "stowage_planner_objects": "planner",
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


def _included_layers(root: Path, layer: str) -> set[str]:
    """The other layers the files of `layer` (and of the layers inside its folder) include."""
    found: set[str] = set()
    for prefix, owner in LAYERS.items():
        if owner != layer or not (root / prefix).is_dir():
            continue
        for path in (root / prefix).rglob("*"):
            if path.suffix in SOURCES and path.is_file() and layer_of(path.relative_to(root).as_posix()) == layer:
                found.update(layer_of(m.group(1)) for m in INCLUDE.finditer(path.read_text(errors="replace")))
    return found - {None, layer}  # type: ignore[arg-type]


def _linked(root: Path) -> dict[str, tuple[str, set[str]]]:
    """Target -> (its CMakeLists.txt, the layers it links or takes objects from), over every
    target_link_libraries and $<TARGET_OBJECTS:...> of the layers' CMake files."""
    linked: dict[str, tuple[str, set[str]]] = {}
    for prefix in LAYERS:
        cmake = root / prefix / "CMakeLists.txt"
        if not cmake.is_file():
            continue
        text = cmake.read_text()
        where = cmake.relative_to(root).as_posix()
        for target in re.findall(r"(?:add_library|pybind11_add_module)\(\s*(\w+)", text):
            if target in TARGETS:
                linked.setdefault(target, (where, set()))
        for match in LINK.finditer(text):
            if match.group(1) in TARGETS:
                names = re.findall(r"[\w:]+", match.group(2))
                linked.setdefault(match.group(1), (where, set()))[1].update(
                    TARGETS[n] for n in names if n in TARGETS and TARGETS[n] != TARGETS[match.group(1)])
        for target, body in re.findall(r"(?:add_library|pybind11_add_module|target_sources)\(\s*(\w+)([^)]*\))", text):
            objects = re.findall(r"TARGET_OBJECTS:(\w+)>", body)
            if target in TARGETS:
                linked.setdefault(target, (where, set()))[1].update(
                    TARGETS[o] for o in objects if o in TARGETS and TARGETS[o] != TARGETS[target])
    return linked


def check_declared(root: Path) -> list[Violation]:
    """Each target links the layers its sources include, and only those (a layer it reaches
    through one it links counts as declared)."""
    found: list[Violation] = []
    for target, (where, declared) in sorted(_linked(root).items()):
        layer = TARGETS[target]
        own = SPANS.get(layer, {layer})
        used = set().union(*(_included_layers(root, part) for part in own)) - own
        below = set().union(*(allowed(part) for d in declared for part in SPANS.get(d, {d})))
        reachable = set().union(*(SPANS.get(x, {x}) for x in below))
        for unused in sorted(declared - {TARGETS[u] for u in TARGETS if TARGETS[u] in used} - used):
            if not SPANS.get(unused, {unused}) & used:
                found.append(Violation(where, f"{target} ({layer}) links {unused} but includes nothing of it"))
        for missing in sorted(used - reachable):
            found.append(Violation(where, f"{target} ({layer}) includes {missing} but does not link it"))
    return found


def check_python(root: Path) -> list[Violation]:
    """Every import circle of the stowage package, named by one of its shortest cycles."""
    package = root / "python" / "stowage"
    if not package.is_dir():
        return []
    graph = python_imports.import_graph(package, root / "python" / "bindings")
    return [Violation("python/stowage", "import circle: " + " -> ".join(python_imports.one_path(graph, component))
                      + f" ({len(component)} modules: {', '.join(component)})")
            for component in python_imports.circles(graph)]


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    violations = check_includes(root) + check_links(root) + check_declared(root) + check_python(root)
    for violation in violations:
        print(f"{violation.where}: {violation.what}")
    if violations:
        print(f"check_layering: {len(violations)} dependencies point against the layers")
        return 1
    print("check_layering: every include and link points down the layers, each target links what it uses, "
          "and the Python package has no import circle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
