"""Byte counts given as ints or as sizes such as "4GiB", checked, with errors naming the argument."""

from __future__ import annotations

import operator

from stowage import _core

MAX_BYTE_COUNT = 2**60  # 1 EiB: beyond any memory, and sums of such stay within C++'s 64-bit sizes


def parsed(value: int | str, name: str) -> int:
    """An int, or a size such as "4GiB" parsed; TypeError naming `name` for anything else."""
    if isinstance(value, str):
        try:
            return int(_core.parse_byte_size(value))
        except ValueError as error:  # the parser's message, with the argument's name
            raise type(error)(f"{name}: {str(error).split(' (at ')[0]}") from None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int or a size such as '4GiB', not {type(value).__name__}")
    return operator.index(value)


def byte_count(value: int | str, name: str = "a size in bytes") -> int:
    """A byte count from an int or a size such as "4GiB"; TypeError or ValueError naming `name`
    for anything else, or for a count outside 0 to MAX_BYTE_COUNT."""
    return in_range(value, name, 0, MAX_BYTE_COUNT, "from 0 to 2**60 bytes")


def in_range(value: int | str, name: str, low: int, high: int, bounds: str) -> int:
    """`value` parsed, within [low, high] (`bounds` says them), or ValueError naming `name`."""
    size = parsed(value, name)
    if not low <= size <= high:
        raise ValueError(f"{name} must be {bounds}, not {value!r}")
    return size
