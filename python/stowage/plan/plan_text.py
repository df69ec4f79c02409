"""A plan as text: its decisions grouped by module (a model's repeated blocks folded into one
line each way), the predicted peak and step time, and the comparison points (``comparison_plans``,
which stowage.plan.applying also offers). Reads a plan by its attributes, importing nothing of
stowage.plan."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from stowage import _core


def comparison_plans(trace: Any) -> dict[str, list[str]]:
    """The points a plan is judged against: nothing changed, every block fully recomputed (full
    activation checkpointing), every tensor that can be offloaded offloaded."""
    tensors = trace.tensors
    return {"no change": ["keep"] * len(tensors),
            "full checkpointing": ["recompute" if t.recomputable else "keep" for t in tensors],
            "offload everything": ["offload" if t.offloadable else "keep" for t in tensors]}


def _group(path: str) -> str:
    """``blocks.3.mlp.fc1`` -> ``blocks.*.mlp``: a block's index folded, the leaf dropped."""
    folded = re.sub(r"\.\d+(?=\.|$)", ".*", path)
    return folded.rsplit(".", 1)[0] if "." in folded else folded or "(top)"


def decisions_by_module(plan: Any) -> dict[str, dict[str, int]]:
    """Bytes per decision for each module group."""
    grouped: dict[str, dict[str, int]] = defaultdict(lambda: {"keep": 0, "offload": 0, "recompute": 0})
    for tensor, decision in zip(plan.trace.tensors, plan.decisions):
        grouped[_group(tensor.module)][decision] += tensor.bytes
    return dict(grouped)


def outcomes(plan: Any) -> dict[str, dict[str, Any]]:
    """Predicted peak and step time of the plan and of each comparison point."""
    rows = {"plan": plan.prediction}
    for name, decisions in comparison_plans(plan.trace).items():
        rows[name] = plan.simulate(decisions)
    return {name: {"peak_bytes": int(s.peak_bytes), "step_ms": float(s.step_ms)} for name, s in rows.items()}


def describe(plan: Any) -> str:
    f = _core.format_bytes
    lines = [f"stowage plan: budget {f(plan.budget)}, {len(plan.decisions)} saved tensors "
             f"({'fits' if plan.fits else 'does not fit'})", "",
             f"{'module':<40} {'keep':>12} {'offload':>12} {'recompute':>12}"]
    for module, by_decision in sorted(decisions_by_module(plan).items()):
        lines.append(f"{module:<40} {f(by_decision['keep']):>12} {f(by_decision['offload']):>12} "
                     f"{f(by_decision['recompute']):>12}")
    lines += ["", f"{'':<20} {'peak':>12} {'step':>12}"]
    for name, row in outcomes(plan).items():
        lines.append(f"{name:<20} {f(row['peak_bytes']):>12} {row['step_ms']:>10.1f}ms")
    return "\n".join(lines)
