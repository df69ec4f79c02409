"""Printing what a file holds on a terminal, literally.

Snapshots, lifetime traces and plans come from other people's runs, and their strings (file names in
stack frames, module paths, op names) reach the commands' output. A string shown on a terminal
must show what it holds and do nothing else: no escape sequence may move the cursor, clear the
screen, set the window's title or make a hyperlink, no bidirectional override may reorder what
follows it, and no ``[bold]`` may be taken for rich's markup (``exp[v2]/train.py`` is a real
path). So:

- ``literal(text)``: every character that is not printable (control characters C0 and C1 with
  ESC among them, DEL, format characters such as U+202E, line and paragraph separators,
  surrogates, unassigned code points) escaped as Python writes it (``\\x1b``, ``\\u202e``);
- ``console(...)``: a rich Console that reads no markup and no emoji codes in what it prints;
  commands style their own text with ``style=`` and rich's Text, never with markup in strings.

JSON output needs neither: json.dumps escapes control characters itself.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console


def literal(text: str) -> str:
    """`text` with every character that is not printable escaped (``\\x1b``, ``\\u202e``)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


def console(**options: Any) -> Any:
    """A rich Console (options as rich's: stderr, width, soft_wrap) that prints strings as they
    are: no markup, no emoji codes."""
    return Console(markup=False, emoji=False, **options)
