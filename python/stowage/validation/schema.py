"""A schema with bounds, for the JSON files stowage reads (profiles, sized profiles, plans).

A schema is built of a few specs, each a type with its bounds:

    Int(low, high, why)     an integer (not a boolean) in [low, high]; `why`: the reason for high
    Number(low, high, why)  an integer or a finite number in [low, high]
    Bool()                  true or false
    Text(max_chars)         a string
    Choice(*names)          one of these strings
    ListOf(item, max_items) a list of items, at most max_items of them
    Row(item, item, ...)    a list of exactly these items (a tuple, in the file)
    Record(required, optional)  an object with these fields: required ones present, no others

A bound is a number, or Ref(name, why), a number the document itself sets (how many ops a trace
has, for the index of an op), looked up in the ``bounds`` given to ``check``: a bound the file
sets for itself is checked against the file. ``check(value, spec, where, bounds)`` walks a
document once, without recursion deeper than the schema's own (a list where a number belongs is
refused, not walked), and raises InputError naming the file (`where`), the field
(``tensors[3].bytes``), the value and the bound. The walk costs nothing per field it accepts
beyond the check itself: a field's path is built only for the refusal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from stowage.validation.errors import InputError, kind_of, shown


@dataclass(frozen=True)
class Ref:
    """A bound the document sets: ``bounds[name]``; `why` says what it is, in a refusal."""

    name: str
    why: str


Bound = int | float | Ref


class Refused(Exception):
    """A field refused: `problem`, and the path to it, built as the refusal unwinds (a spec
    defined elsewhere raises it from its walk)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []


def _wrong_kind(expected: str, value: Any) -> Refused:
    return Refused(f"expected {expected}, got {kind_of(value)}"
                    + (f" ({shown(value)})" if not isinstance(value, (list, dict, type(None))) else ""))


def _bound(bound: Bound, bounds: Mapping[str, int | float], why: str = "") -> tuple[int | float, str]:
    if isinstance(bound, Ref):
        return bounds[bound.name], f", {bound.why}"
    return bound, f" ({why})" if why else ""


def _out_of(value: Any, low: Bound, high: Bound, bounds: Mapping[str, int | float], why: str = "") -> Refused | None:
    lowest, low_why = _bound(low, bounds)
    highest, high_why = _bound(high, bounds, why)
    if value < lowest:
        return Refused(f"{shown(value)} is below {shown(lowest)}{low_why}")
    if value > highest:
        return Refused(f"{shown(value)} is above {shown(highest)}{high_why}")
    return None


class Spec:
    """One field's type and bounds."""

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        raise NotImplementedError


class Int(Spec):
    """`why`: the reason for a fixed upper bound, quoted with it in a refusal."""

    def __init__(self, low: Bound, high: Bound, why: str = "") -> None:
        self.low, self.high, self.why = low, high, why
        self.fixed = not isinstance(low, Ref) and not isinstance(high, Ref)

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not int:
            raise _wrong_kind("an integer", value)
        if self.fixed and self.low <= value <= self.high:  # type: ignore[operator]
            return
        refused = _out_of(value, self.low, self.high, bounds, self.why)
        if refused is not None:
            raise refused


class Number(Spec):
    """`why`: the reason for a fixed upper bound, quoted with it in a refusal."""

    def __init__(self, low: Bound, high: Bound, why: str = "") -> None:
        self.low, self.high, self.why = low, high, why

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        kind = type(value)
        if kind is not float and kind is not int:
            raise _wrong_kind("a number", value)
        if kind is float and not math.isfinite(value):
            raise Refused(f"{shown(value)} is not a finite number")
        refused = _out_of(value, self.low, self.high, bounds, self.why)
        if refused is not None:
            raise refused


class Bool(Spec):
    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not bool:
            raise _wrong_kind("true or false", value)


class Text(Spec):
    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not str:
            raise _wrong_kind("a string", value)
        if len(value) > self.max_chars:
            raise Refused(f"a string of {len(value):,} characters is above {self.max_chars:,}")


class Choice(Spec):
    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)
        self.listed = ", ".join(repr(name) for name in names)

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not str or value not in self.names:
            raise Refused(f"{shown(value)} is not one of {self.listed}")


class ListOf(Spec):
    def __init__(self, item: Spec, max_items: Bound, min_items: int = 0) -> None:
        self.item, self.max_items, self.min_items = item, max_items, min_items

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not list:
            raise _wrong_kind("a list", value)
        most, why = _bound(self.max_items, bounds)
        if len(value) > most:
            raise Refused(f"a list of {len(value):,} items is above {most:,}{why}")
        if len(value) < self.min_items:
            raise Refused(f"a list of {len(value):,} items is below {self.min_items:,}")
        walk = self.item.walk
        index = 0
        try:
            for index, item in enumerate(value):
                walk(item, bounds)
        except Refused as refused:
            refused.path.append(index)
            raise


class Row(Spec):
    def __init__(self, *items: Spec) -> None:
        self.items = items

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not list or len(value) != len(self.items):
            raise Refused(f"expected a list of {len(self.items)} items, got {shown(value)}")
        index = 0
        try:
            for index, (spec, item) in enumerate(zip(self.items, value)):
                spec.walk(item, bounds)
        except Refused as refused:
            refused.path.append(index)
            raise


class Record(Spec):
    def __init__(self, required: Mapping[str, Spec], optional: Mapping[str, Spec] | None = None) -> None:
        self.required = dict(required)
        self.fields = {**self.required, **(optional or {})}
        self.listed = ", ".join(self.fields)

    def walk(self, value: Any, bounds: Mapping[str, int | float]) -> None:
        if type(value) is not dict:
            raise _wrong_kind("an object", value)
        fields = self.fields
        key: str | None = None
        try:
            for key, item in value.items():
                spec = fields.get(key)  # type: ignore[arg-type]
                if spec is None:
                    unknown, key = key, None
                    raise Refused(f"unknown field {shown(unknown)} (fields: {self.listed})")
                spec.walk(item, bounds)
        except Refused as refused:
            if key is not None:
                refused.path.append(key)
            raise
        if len(value) < len(fields):
            for name in self.required:
                if name not in value:
                    raise Refused(f"missing field {name!r}")


def check(value: Any, spec: Spec, where: str, bounds: Mapping[str, int | float] | None = None,
          field: str = "") -> None:
    """Raises InputError naming `where`, the field (below `field`), the value and the bound, for
    the first part of `value` that `spec` refuses."""
    try:
        spec.walk(value, bounds or {})
    except Refused as refused:
        raise InputError(where, field_path([field] if field else [], reversed(refused.path)),
                         refused.problem) from None


def field_path(start: list[str | int], parts: Any) -> str:
    """``tensors[3].bytes`` from ["tensors", 3, "bytes"]."""
    text = ""
    for part in [*start, *parts]:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def refuse(where: str, path: list[str | int], problem: str) -> InputError:
    """The InputError for a refusal found outside a spec (a rule across fields)."""
    return InputError(where, field_path([], path), problem)
