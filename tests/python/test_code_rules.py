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
    for folder in ("base", "device", "allocator", "offload", "planner", "python/bindings", "python/libtorch",
                   "python/tensors"):
        shutil.copytree(REPO / folder, root / folder)
    return root


def test_the_tree_keeps_its_layers() -> None:
    result = run(LAYERING, REPO)
    assert result.returncode == 0, result.stdout


BREACHES = [
    # (file, text added at its end, what the check says)
    ("device/backend.hpp", '#include "allocator/caching_allocator.hpp"',
     "device includes allocator/caching_allocator.hpp of allocator"),
    ("device/host/host_backend.cpp", '#include "device/cuda/cuda_backend.hpp"',
     "host device includes device/cuda/cuda_backend.hpp of cuda device"),
    ("base/CMakeLists.txt", "target_link_libraries(stowage_base PUBLIC stowage_device)",
     "stowage_base (base) links stowage_device (device)"),
    # A link the target's sources have no use for: allowed by the layers, still a false declaration.
    ("python/libtorch/CMakeLists.txt", "target_link_libraries(stowage_torch PRIVATE stowage_allocator)",
     "stowage_torch (libtorch) links allocator but includes nothing of it"),
    # The tensor side below its bindings: it knows nothing of pybind11's module.
    ("python/tensors/check_mode.cpp", '#include "python/bindings/torch/module_parts.hpp"',
     "tensors includes python/bindings/torch/module_parts.hpp of torch bindings"),
]


def test_an_include_of_a_layer_the_target_does_not_link_is_named(tmp_path: Path) -> None:
    """The layers allow the core bindings offload/, and module.cpp includes it: without the link, named."""
    root = copy_layers(tmp_path)
    listing = root / "python/bindings/CMakeLists.txt"
    text = listing.read_text()
    assert " stowage_offload " in text
    listing.write_text(text.replace(" stowage_offload ", " ", 1))
    result = run(LAYERING, root)
    assert result.returncode == 1
    assert "_core (core bindings) includes offload but does not link it" in result.stdout


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
    # Modules of one layer (check_layering.PYTHON_LAYERS), so that only the circle is wrong.
    (package / "byte_counts.py").write_text("from stowage import _core\n\ndef f():\n"
                                            "    from stowage.terminal import g\n")
    (package / "terminal.py").write_text("from stowage.byte_counts import f\n")
    (package / "validation.py").write_text("import stowage.byte_counts\n")
    result = run(LAYERING, root)
    assert result.returncode == 1
    assert ("import circle: stowage.byte_counts -> stowage.terminal -> stowage.byte_counts (2 modules"
            in result.stdout)
    assert "validation" not in result.stdout  # importing into a circle is not being in it
    (package / "byte_counts.py").write_text("from stowage import _core\n")
    assert run(LAYERING, root).returncode == 0  # _core is the compiled module, not the package


def test_an_import_of_a_higher_python_layer_and_a_module_of_no_layer_are_named(tmp_path: Path) -> None:
    root = copy_layers(tmp_path)
    shutil.copytree(REPO / "python" / "stowage", root / "python" / "stowage")
    assert run(LAYERING, root).returncode == 0
    low = root / "python" / "stowage" / "warning_site.py"
    lines = len(low.read_text().splitlines())
    low.write_text(low.read_text() + "\n\ndef planned():\n    from stowage.plan import file_formats\n")
    (root / "python" / "stowage" / "unplaced.py").write_text("from stowage import byte_counts\n")
    result = run(LAYERING, root)
    assert result.returncode == 1
    assert (f"python/stowage/warning_site.py:{lines + 4}: stowage.warning_site (basics) imports "
            "stowage.plan.file_formats of plan, a higher layer") in result.stdout  # inside a function too
    assert "python/stowage/unplaced.py: stowage.unplaced is in no layer" in result.stdout
    assert "stowage.plan" not in result.stdout.replace("stowage.plan.file_formats", "")  # downward imports pass


def test_tests_and_bench_including_what_is_not_a_public_header_are_named(tmp_path: Path) -> None:
    root = copy_layers(tmp_path)
    (root / "bench" / "planner").mkdir(parents=True)
    (root / "tests" / "planner").mkdir(parents=True)
    (root / "bench" / "planner" / "fine.cpp").write_text(
        '#include "planner/simulator.hpp"\n#include "base/errors.hpp"\n#include "bench_helpers.hpp"\n')
    assert run(LAYERING, root).returncode == 0
    (root / "tests" / "planner" / "bad_test.cpp").write_text(
        '#include "planner/simulator.hpp"\n#include "planner/simulator.cpp"\n'
        '#include "python/bindings/python_objects.hpp"\n'
        '#include "allocator/detail/pools.hpp"\n#include "offload/offloader_impl.hpp"\n')
    result = run(LAYERING, root)
    assert result.returncode == 1
    said = [line for line in result.stdout.splitlines() if line.startswith("tests/")]
    assert said == [
        "tests/planner/bad_test.cpp:2: includes planner/simulator.cpp: a library's source file, not a header",
        "tests/planner/bad_test.cpp:3: includes python/bindings/python_objects.hpp: a file of the Python bindings, "
        "not of a library",
        "tests/planner/bad_test.cpp:4: includes allocator/detail/pools.hpp: a library's private header",
        "tests/planner/bad_test.cpp:5: includes offload/offloader_impl.hpp: a library's private header",
    ]


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
