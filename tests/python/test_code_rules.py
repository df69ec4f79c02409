"""The checks behind the layering and code-size rules catch a breach, and pass on the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

LAYERING = REPO / "tools" / "check_layering.py"
CODE_SIZE = REPO / "tools" / "check_code_size.py"


def run(script: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True)


def copy_layers(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for folder in ("allocator", "offload", "planner", "python/bindings", "python/libtorch"):
        shutil.copytree(REPO / folder, root / folder)
    return root


def test_the_tree_keeps_its_layers() -> None:
    result = run(LAYERING, REPO)
    assert result.returncode == 0, result.stdout


BREACHES = [
    # (file, text added at its end, what the check says)
    ("allocator/device/backend.hpp", '#include "allocator/caching_allocator.hpp"',
     "device includes allocator/caching_allocator.hpp of allocator"),
    ("allocator/device/host/host_backend.cpp", '#include "allocator/device/cuda/cuda_backend.hpp"',
     "host device includes allocator/device/cuda/cuda_backend.hpp of cuda device"),
    ("allocator/base/CMakeLists.txt", "target_link_libraries(stowage_base PUBLIC stowage_device)",
     "stowage_base (base) links stowage_device (device)"),
    # A link the target's sources have no use for: allowed by the layers, still a false declaration.
    ("python/libtorch/CMakeLists.txt", "target_link_libraries(stowage_torch PRIVATE stowage_allocator)",
     "stowage_torch (libtorch) links allocator but includes nothing of it"),
    # An include of a layer the target does not link, though the layers allow it.
    ("python/bindings/module.cpp", '#include "offload/offloader.hpp"',
     "_core (core bindings) includes offload but does not link it"),
]


@pytest.mark.parametrize(("relative", "added", "said"), BREACHES)
def test_a_dependency_against_the_layers_is_named(tmp_path: Path, relative: str, added: str,
                                                  said: str) -> None:
    root = copy_layers(tmp_path)
    path = root / relative
    path.write_text(path.read_text() + "\n" + added + "\n")
    result = run(LAYERING, root)
    assert result.returncode == 1
    assert f"{relative}:" in result.stdout
    assert said in result.stdout


def test_a_python_import_circle_is_named_even_through_a_function(tmp_path: Path) -> None:
    root = copy_layers(tmp_path)
    package = root / "python" / "stowage"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("from stowage import _core\n\ndef f():\n    from stowage.high import g\n")
    (package / "high.py").write_text("from stowage.low import f\n")
    (package / "apart.py").write_text("import stowage.low\n")
    result = run(LAYERING, root)
    assert result.returncode == 1
    assert "import circle: stowage.high -> stowage.low -> stowage.high (2 modules" in result.stdout
    assert "apart" not in result.stdout  # importing into a circle is not being in it
    (package / "low.py").write_text("from stowage import _core\n")
    assert run(LAYERING, root).returncode == 0  # _core is the compiled module, not the package


def test_the_tree_keeps_the_size_rules() -> None:
    result = run(CODE_SIZE, REPO)
    assert result.returncode == 0, result.stdout


def test_a_long_function_and_a_long_file_are_named(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "allocator").mkdir(parents=True)
    body = "".join(f"  total += {i};\n" for i in range(81))
    (root / "allocator" / "long_function.cpp").write_text(f"int sum() {{\n  int total = 0;\n{body}  return total;\n}}\n")
    (root / "allocator" / "long_file.hpp").write_text("// a line\n" * 801)
    result = run(CODE_SIZE, root)
    assert result.returncode == 1
    assert "allocator/long_function.cpp:1: sum has 85 lines (at most 80)" in result.stdout
    assert "allocator/long_file.hpp:1: 801 lines (at most 800)" in result.stdout
