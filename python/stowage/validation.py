"""The one validation layer every reader of a file stowage did not write in this process goes through.

``InputError`` is what every refusal raises (README: "How the code is kept"); the formats' schemas
are checked in C++ where the formats are read. ``shown(value)`` and ``kind_of(value)`` are how a
refusal quotes a value taken from a file and names its JSON kind; the plan files' C++ reader
(python/bindings/plan_file_bindings.cpp) quotes through them.

``read_json(path, kind)`` returns a JSON file's document with what it may cost bounded before
anything is built, or raises InputError naming the file and the bound it breaks:

- its size, MAX_JSON_BYTES (64 MiB), checked before it is read;
- how densely it packs values, checked on its bytes before it is parsed (bytes.count, at memory
  speed): json.loads makes a Python object for every value, and a file of tiny ones (``[[],[],
  ...]``, 3 bytes a list of 56) would cost 24 times its size. The bounds below admit every file
  stowage writes, whose values are sparser (a lifetime trace: a container every 110-160
  bytes, a field or item every 11-12 (10.9 written without spaces), a quote every 8.4-9), and
  hold a reading to about 10 times the file (bench/results/2026-11-26-cpu-hostile-input.md);
- nesting, through json's own limit (RecursionError, refused as such: no stowage file nests
  more than 6 deep, and the schema refuses a container where a value belongs);
- NaN and Infinity, which JSON does not have and json.loads accepts; integers longer than
  Python converts (4,300 digits).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stowage.terminal import literal

_SHOWN_CHARS = 60  # of a string quoted in a message
_SHOWN_DIGITS = 40  # of an integer quoted in a message


class InputError(ValueError):
    """A file (or a value given for one) that stowage refuses to read: unreadable, hostile, or
    not what it claims to be. ``where`` the file, ``field`` the path of the field in it (empty
    when the whole file is refused), ``problem`` what is wrong (the value and the bound)."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        self.where, self.field, self.problem = where, field, problem
        parts = [str(where)] if where else []
        if field:
            parts.append(field)
        super().__init__(literal(": ".join([*parts, problem])))


def shown(value: Any) -> str:
    """`value` as a refusal quotes it: numbers and short strings as written, longer ones cut,
    containers by their kind and size, every control character escaped."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        text = str(value) if value.bit_length() < 128 else f"an integer of {value.bit_length():,} bits"
        return text if len(text) <= _SHOWN_DIGITS else text[:_SHOWN_DIGITS] + "..."
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        cut = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "..."
        return "'" + literal(cut).replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value):,} items"
    if isinstance(value, dict):
        return f"an object of {len(value):,} fields"
    return f"a {type(value).__name__}"


def kind_of(value: Any) -> str:
    """A value's JSON kind, as a refusal names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


# A lifetime trace of a real step is 0.1-3 MB, a sized one a few times that. The densest file the bounds
# below admit (an object of distinct 11-character keys) costs json.loads 12.5 times its size and
# 8 s for 64 MiB: beyond that, a file could pass 200 MB and 10 times its size, or 10 s.
MAX_JSON_BYTES = 64 << 20
# Bytes of file a value may take at least, on average over the file (see the module docstring);
# small files are not held to them (a floor of values), as their cost is small whatever it is.
BYTES_PER_CONTAINER = 32  # '[' and '{'
BYTES_PER_ITEM = 8  # ',' and ':' (a list's items and an object's fields)
BYTES_PER_QUOTE = 5  # '"' (two a string)
FREE_VALUES = 4096


def _density_problem(raw: bytes) -> str | None:
    """What makes `raw` pack its values more densely than a stowage file does, if anything."""
    size = len(raw)
    for what, count, least in (
            ("lists and objects", raw.count(b"[") + raw.count(b"{"), BYTES_PER_CONTAINER),
            ("items and fields", raw.count(b",") + raw.count(b":"), BYTES_PER_ITEM),
            ("quotes", raw.count(b'"'), BYTES_PER_QUOTE)):
        if count > FREE_VALUES + size // least:
            return (f"{count:,} {what} in {size:,} bytes, more than one every {least} bytes (the most a "
                    f"stowage file has): refused before parsing, as each would cost a Python object")
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: str | Path, kind: str) -> Any:
    """The JSON document in `path` (`kind` names what it should be, for refusals: "a stowage
    lifetime trace"); InputError naming the file and the bound it breaks."""
    where = str(path)
    try:
        with open(path, "rb") as file:
            stat = os.fstat(file.fileno())
            if stat.st_size > MAX_JSON_BYTES:
                raise InputError(where, "", f"{stat.st_size:,} bytes is above {MAX_JSON_BYTES:,} (64 MiB), the "
                                            f"largest file stowage reads as {kind}")
            raw = file.read(MAX_JSON_BYTES + 1)
    except OSError as error:
        raise InputError(where, "", f"cannot read: {error.strerror or error}") from None
    if len(raw) > MAX_JSON_BYTES:  # a pipe or a device: no size to check first
        raise InputError(where, "", f"more than {MAX_JSON_BYTES:,} bytes (64 MiB), the largest file stowage "
                                    f"reads as {kind}")
    problem = _density_problem(raw)
    if problem is not None:
        raise InputError(where, "", f"not {kind}: {problem}")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise InputError(where, "", f"not {kind}: nested deeper than JSON is read (no stowage file nests "
                                    "more than 6 levels)") from None
    except MemoryError:
        raise InputError(where, "", f"not {kind}: ran out of memory parsing it") from None
    except (UnicodeDecodeError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        raise InputError(where, "", f"not {kind} (not JSON: {str(error)[:200]})") from None
