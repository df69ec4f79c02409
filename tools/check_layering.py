#!/usr/bin/env python3
"""Checks that stowage's dependencies point one way (README, "Layout").

Each C++ source folder is a layer; a layer may include and link only the layers below it:

    base  <-  device  <-  allocator  <-  process  <-  libtorch  <-  tensors  <-  torch bindings
      ^                        ^  <-  offload  <-----------------------------'
      ^                        ^  <-  core bindings (offload, planner and snapshot too)
      ^  <-  planner (the step's model: nothing of the allocator's or the engine's)
      ^  <-  snapshot (the snapshot reader: nothing of the allocator's)

(device/host and device/cuda are the two devices inside the device layer and never include each
other.) Six things are checked:
- every ``#include "..."`` of a file in a layer names a file of its own layer or of one it may
  depend on;
- every ``target_link_libraries`` of a layer's target names only targets it may depend on;
- each target declares the layers it uses and no other: a layer it links is one its sources
  include, and a layer they include is one it links (or one below a layer it links);
- the Python package has no import circle (tools/python_imports.py says what counts);
- the Python package's parts keep an order (PYTHON_LAYERS, lowest first): a module imports only
  modules of its own layer or of a lower one, at module level or inside a function, and every
  module belongs to a layer (a part is a subpackage, such as ``stowage.plan``, or a module directly
  in the package, such as ``stowage.memory``);
- tests/ and bench/ include only public headers of the C++ libraries (allocator, with base and
  device inside it, offload, planner, snapshot): a header (.hpp, .h, .cuh) whose path has no
  ``detail`` or ``internal`` folder and whose name does not end in ``_impl``, ``_detail`` or
  ``_internal``; never a library's source file (.cpp, .cu), and nothing of python/ (the bindings
  and the libtorch glue are the Python modules' insides, not libraries). Their own helpers
  (tests/..., bench/...) and system headers are theirs to include.
Otherwise tests/, bench/ and tools/ sit on top and are not checked.

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
    "base": "base",
    "device/host": "host device",
    "device/cuda": "cuda device",
    "device": "device",
    "allocator/process": "process",
    "allocator": "allocator",
    "offload": "offload",
    "planner": "planner",
    "snapshot": "snapshot",
    "python/libtorch": "libtorch",
    "python/tensors": "tensors",
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
    "tensors": {"libtorch", "offload", "host device"},  # CPU mode
    "torch bindings": {"tensors"},
    "snapshot": {"base"},
    "core bindings": {"allocator", "offload", "planner", "snapshot"},  # offload: its statistics' lines
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
    "stowage_tensors": "tensors",
    "_torch": "torch bindings",
    "_core": "core bindings",
}

# The Python package's parts by layer, lowest first: a part imports only its own layer's and lower
# ones'. "__init__" is the package itself (``import stowage``).
PYTHON_LAYERS: list[tuple[str, set[str]]] = [
    ("basics", {"byte_counts", "terminal", "warning_site", "validation"}),
    ("snapshot files", {"snapshot_reader", "profiler_snapshot"}),
    ("torch serving", {"serving", "step_context", "checking", "tagging"}),
    ("offload", {"offload"}),
    ("memory", {"memory"}),
    ("plan", {"plan"}),
    ("fitting", {"fitting", "models"}),
    ("package", {"__init__", "_autoload"}),
    ("commands", {"inspection", "diff", "replay", "record", "doctor", "demo", "cli", "__main__"}),
]

# The C++ libraries whose public headers tests/ and bench/ may include.
LIBRARIES = ("allocator", "offload", "planner", "snapshot")
HEADERS = (".hpp", ".h", ".cuh")
PRIVATE_FOLDERS = {"detail", "internal"}
PRIVATE_SUFFIXES = ("_impl", "_detail", "_internal")

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


def python_part(module: str) -> str:
    """The part of the package `module` is in: its subpackage, or itself directly in the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def check_python_layers(root: Path) -> list[Violation]:
    """Every import of a higher layer's module, and every module of no layer (PYTHON_LAYERS)."""
    package = root / "python" / "stowage"
    if not package.is_dir():
        return []
    rank = {part: (index, name) for index, (name, parts) in enumerate(PYTHON_LAYERS) for part in parts}
    files = python_imports.module_files(package)
    found: list[Violation] = []
    for module, path in files.items():
        if python_part(module) not in rank:
            found.append(Violation(path.relative_to(root).as_posix(),
                                   f"{module} is in no layer: add {python_part(module)!r} to PYTHON_LAYERS"))
    for module, line, target in python_imports.imports(package, root / "python" / "bindings"):
        low, high = rank.get(python_part(module)), rank.get(python_part(target))
        if low is not None and high is not None and high[0] > low[0]:
            where = f"{files[module].relative_to(root).as_posix()}:{line}"
            found.append(Violation(where, f"{module} ({low[1]}) imports {target} of {high[1]}, a higher layer"))
    return found


def public_header_problem(included: str) -> str | None:
    """Why tests/ and bench/ may not include `included`; None when they may."""
    parts = included.split("/")
    if parts[0] == "python":
        return "a file of the Python bindings, not of a library"
    if parts[0] not in LIBRARIES:
        return None  # their own helpers, or a system header
    name, _, suffix = parts[-1].rpartition(".")
    if "." + suffix not in HEADERS:
        return "a library's source file, not a header"
    if PRIVATE_FOLDERS & set(parts[:-1]) or name.endswith(PRIVATE_SUFFIXES):
        return "a library's private header"
    return None


def check_public_headers(root: Path) -> list[Violation]:
    """Every include in tests/ and bench/ of what is not a library's public header."""
    found: list[Violation] = []
    for folder in ("tests", "bench"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            text = path.read_text(errors="replace")
            for match in INCLUDE.finditer(text):
                problem = public_header_problem(match.group(1))
                if problem is not None:
                    line = text.count("\n", 0, match.start()) + 1
                    found.append(Violation(f"{path.relative_to(root).as_posix()}:{line}",
                                           f"includes {match.group(1)}: {problem}"))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    violations = (check_includes(root) + check_links(root) + check_declared(root) + check_python(root)
                  + check_python_layers(root) + check_public_headers(root))
    for violation in violations:
        print(f"{violation.where}: {violation.what}")
    if violations:
        print(f"check_layering: {len(violations)} dependencies point against the layers")
        return 1
    print("check_layering: every include and link points down the layers, each target links what it uses, "
          "the Python package has no import circle and keeps its layers, and tests and bench include only "
          "public headers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
