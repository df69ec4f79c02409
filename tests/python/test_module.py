"""stowage._core's small helpers, and the command's basics."""

from __future__ import annotations

import subprocess
import sys

import pytest

import stowage
from stowage import _core


def test_byte_sizes_parse_and_format() -> None:
    assert stowage.parse_byte_size("4GiB") == 4 << 30
    assert stowage.parse_byte_size("1.5 MB") == 1_500_000
    assert stowage.parse_byte_size("4096") == 4096
    assert stowage.format_bytes(3 << 29) == "1.50 GiB"
    with pytest.raises(ValueError, match="unknown unit"):
        stowage.parse_byte_size("4 parsecs")


def test_allocator_configuration_is_parsed_in_cpp() -> None:
    assert _core.normalize_allocator_config("limit:1GiB, max_split_size_mb:64") == (
        "max_split_size_mb:64,limit:1073741824")
    assert _core.normalize_allocator_config("") == ""
    with pytest.raises(_core.LogicError, match="given twice"):
        _core.normalize_allocator_config("limit:1GiB,limit:2GiB")


def test_the_command_has_a_version_and_help() -> None:
    version = subprocess.run([sys.executable, "-m", "stowage", "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == f"stowage {stowage.__version__}"
    usage = subprocess.run([sys.executable, "-m", "stowage"], capture_output=True, text=True)
    assert usage.returncode == 2
    assert "replay" in usage.stderr
