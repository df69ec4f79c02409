"""What every reader of a file stowage did not write in this process raises: InputError.

A refusal names the file, the field, the value and the bound it breaks, as one message
(``step.json: cost.prefetch_depth: 100000 is above 38, the trace's saved tensors``); the parts
are kept as attributes for callers that want them. The snapshot reader's SnapshotError is an
InputError too, so a command catches one class for "bad input" (exit status 2).

``shown(value)`` is how a refusal quotes a value taken from a file: short, and with control
characters escaped (stowage.terminal.literal), so that a message printed on a terminal shows
what the file holds without acting on it.
"""

from __future__ import annotations

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
