"""Check mode: every byte stowage moves away from where training left it is verified when it
comes back. Turn it on first when a loss curve differs from the one without stowage.

    STOWAGE_CHECK=1 python train.py        # or stowage.enable(..., check=True), or set_enabled(True)

- A tensor the offload engine offloads (``stowage.offload.activations()``, a plan's offload) has
  a checksum of its bytes taken on the device as it leaves, compared with the bytes that come
  back before backward uses them (python/bindings/torch/tensor_offloader.cpp).
- A parameter the offloaded optimizer updated on the host is compared, once written back, with
  the host's result (stowage.offload.adam).
A mismatch raises RuntimeError naming the tensor, the module it belongs to and the step
(``stowage.mark_step()`` / ``stowage.offload.end_step()`` count steps). Off by default: it reads
every offloaded and updated byte once more and waits for the comparisons
(bench/results/2026-11-26-cpu-exactness.md has its cost).

Contract: one process-wide switch; set it between steps.
"""

from __future__ import annotations

import os
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
    if _enabled:
        apply()


def apply() -> None:
    """Hands the switch to the C++ side and starts naming parameters (called once torch loads)."""
    torch_module().set_check_mode(_enabled)
    if _enabled:
        _watch_modules()


def step() -> int:
    """The steps ended so far in this process (the number of the step running now)."""
    return int(torch_module().offload_steps_ended())


def _watch_modules() -> None:
    """Names every parameter of each model whose forward runs (for the messages), from the
    step context's module calls (subscribed once, for the process)."""
    global _hook
    if _hook is None:
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
