"""Where a warning of stowage's points: the caller's line, not stowage's own.

``warnings.warn(..., stacklevel=outside_stowage())`` attributes the warning to the innermost frame
outside this package (and outside the libraries that call back into it: torch's hooks and
contexts, a Trainer's loop), so the file and line a user sees are their training loop's, whatever
path of stowage's calls it came through.
"""

from __future__ import annotations

import sys
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parent)
_LIBRARIES = ("torch", "transformers", "accelerate", "contextlib")


def _is_library(filename: str) -> bool:
    path = Path(filename)
    if str(path.resolve()).startswith(_PACKAGE):
        return True
    return any(part in _LIBRARIES for part in path.parts[-4:-1]) or path.name == "contextlib.py"


def outside_stowage() -> int:
    """The stacklevel of the caller's innermost frame that is not stowage's or a library's
    calling back into it (1 is the caller of warnings.warn)."""
    frame = sys._getframe(1)  # the function that warns
    level = 1
    while frame is not None and _is_library(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 2
