"""The import graph of the stowage Python package, and its circles.

A module imports another when any of its ``import`` statements names it, at module level or
inside a function: an import deferred to a function still makes the two modules depend on each
other, it only hides the circle from the interpreter. ``from package import name`` imports the
submodule ``package.name`` when there is one (a .py file or one of the compiled extensions,
``_core`` and ``_torch``), and otherwise the package itself. Importing a submodule also runs its
package's ``__init__``; that is how Python packages work and is not counted as an edge.

A circle is a strongly connected component of more than one module (Tarjan's algorithm).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PYBIND_MODULE = re.compile(r"pybind11_add_module\(\s*(\w+)")


def module_files(package_root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under package_root's parent's package."""
    base = package_root.parent
    modules: dict[str, Path] = {}
    for path in sorted(package_root.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def extension_modules(package: str, bindings_root: Path) -> set[str]:
    """The compiled modules the build installs into the package (their CMake pybind11 targets)."""
    names: set[str] = set()
    for cmake in bindings_root.rglob("CMakeLists.txt"):
        names.update(f"{package}.{name}" for name in PYBIND_MODULE.findall(cmake.read_text()))
    return names


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        parts = package.split(".")
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    names = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        names.append(submodule if submodule in known else base)
    return names


def imports(package_root: Path, bindings_root: Path) -> list[tuple[str, int, str]]:
    """(module, line, module of the package it imports), for every import of every module."""
    files = module_files(package_root)
    known = set(files) | extension_modules(package_root.name, bindings_root)
    found: list[tuple[str, int, str]] = []
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for target in _imported(node, name, path.name == "__init__.py", known):
                if target in files and target != name:
                    found.append((name, node.lineno, target))  # type: ignore[attr-defined]
    return found


def import_graph(package_root: Path, bindings_root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (compiled extensions are leaves)."""
    graph: dict[str, set[str]] = {name: set() for name in module_files(package_root)}
    for name, _, target in imports(package_root, bindings_root):
        graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            descended = False
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    descended = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if descended:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def one_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest circle through the component's first module, to name in a message."""
    start = component[0]
    members = set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return list(reversed(path)) + [start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    return component
