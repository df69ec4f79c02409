"""Check mode's switch (``STOWAGE_CHECK=1``, ``stowage.enable(..., check=True)``, set_enabled) and
the names its messages give parameters; what it verifies: README's "Check mode".

Contract: one process-wide switch; set it between steps.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from stowage import step_context
from stowage.serving import torch_module

_enabled = os.environ.get("STOWAGE_CHECK", "").strip() not in ("", "0")
_parameter_names: dict[int, str] = {}
_named_roots: set[int] = set()
_hook: Any = None


def enabled() -> bool:
    return _enabled


def set_enabled(on: bool) -> None:
    """Turns check mode on or off (between steps)."""
    global _enabled
    _enabled = bool(on)
    if _enabled or "stowage._torch" in sys.modules:  # (off before torch loads: nothing to hand over yet)
        apply()


def apply() -> None:
    """Hands the switch to the C++ side and, on, names every parameter of each model whose forward
    runs, for the messages (from the step context's module calls, subscribed once for the process;
    called once torch loads)."""
    global _hook
    torch_module().set_check_mode(_enabled)
    if _enabled and _hook is None:
        _hook = step_context.module_calls.subscribe(_entered, compiled=True)


def _entered(call: step_context.Call, args: Any) -> None:
    module = call.module
    if id(module) in _named_roots:
        return
    _named_roots.add(id(module))
    for name, parameter in module.named_parameters():
        _parameter_names.setdefault(id(parameter), name)


def parameter_name(parameter: Any) -> str | None:
    """The parameter's path in the first model whose forward ran ("blocks.0.attn.q.weight")."""
    return _parameter_names.get(id(parameter))
