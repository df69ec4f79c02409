"""The table `fit` prints: where the parameters, gradients, optimizer states and activations live,
what the step is predicted to take, and every share of states on the device it weighed."""

from __future__ import annotations

from typing import Any

from stowage._core import format_bytes
from stowage.fitting.choosing import Option
from stowage.fitting.loss_units import LOSS_UNITS_GIVEN
from stowage.fitting.batches import ExampleBatch


def _share(option: Option) -> str:
    return "all (the factory's optimizer)" if option.fraction == 1.0 else f"{option.fraction:.0%}"


def _activations(option: Option, unplanned: int) -> str:
    plan = option.plan
    assert plan is not None
    by_decision = {"keep": 0, "recompute": 0, "offload": 0}
    for tensor, decision in zip(plan.trace.tensors, plan.decisions):
        by_decision[decision] += tensor.bytes
    saved = sum(by_decision.values()) or 1
    split = ", ".join(f"{name} {value / saved:.0%}" for name, value in by_decision.items())
    return (f"step adds {format_bytes(unplanned)} unplanned -> {format_bytes(plan.predicted_peak_bytes)} "
            f"planned (saved bytes: {split})")


def _micro(option: Option, example: ExampleBatch) -> str:
    if option.micro_batches <= 1:
        return f"whole ({example.rows})"
    return f"{option.micro_batches} x {option.micro_rows}"


def _batch_row(chosen: Option, example: ExampleBatch) -> str:
    rows, units = example.rows, example.units
    if chosen.micro_batches > 1:
        assert units is not None
        verified = "as loss_units says" if example.checked == LOSS_UNITS_GIVEN else f"verified: {example.checked}"
        said = (f"{chosen.micro_batches} micro-batches of up to {chosen.micro_rows} rows, gradients accumulated, "
                f"each loss weighted by its share of the batch's {units.name} ({verified})")
    else:
        said = f"run whole ({rows} rows)"
        if units is not None:
            said += f"; cut into micro-batches where that is faster (the loss a mean over {units.name})"
    if example.not_cut:
        said += f"; not cut: {example.not_cut}"
    return f"  {'batch':<24}{rows:>12}  {said}"


def busy_host_note(load: tuple[float, int] | None) -> str:
    """What the predicted times are worth when the host was busy while fit measured them: the
    load average (runnable threads, this process's included) over the cores it may use."""
    if load is None or load[0] <= load[1]:
        return ""
    return (f"; measured on a busy host (load {load[0]:.1f} on {load[1]} cores): the times may be up to "
            f"{load[0] / load[1]:.1f}x long, every share's alike, so the choice between them holds")


def decision_table(chosen: Option, options: list[Option], example: ExampleBatch, facts: dict[str, Any]) -> str:
    memory = facts["memory"]
    on_device = chosen.device_state_bytes
    rows = [
        f"stowage.fit on {facts['device']}: {format_bytes(facts['capacity'])} ({facts['capacity_bound']}), "
        f"{format_bytes(memory.usable)} usable; {facts['recorded']}",
        f"  {'in use before the step':<24}{format_bytes(memory.in_use):>12}  "
        f"parameters ({memory.parameter_count:,}), buffers, the batch",
        f"  {'gradients':<24}{format_bytes(memory.gradients):>12}  made in backward, freed after the optimizer",
        f"  {'optimizer states':<24}{format_bytes(on_device):>12}  on the device; "
        f"{format_bytes(memory.states - on_device)} in host memory ({facts['optimizer']})"
        + (f"; kept on the device: {facts['states_kept_because']}" if facts.get("states_kept_because") else ""),
        f"  {'activations':<24}{format_bytes(chosen.activation_budget):>12}  budget; "
        + _activations(chosen, facts["unplanned_peak"]),
        f"  {'host memory':<24}{format_bytes(chosen.host_bytes):>12}  for the offloaded states and activations, of "
        f"{format_bytes(facts['host'].available)} the process may take ({facts['host'].limited_by})",
        _batch_row(chosen, example),
        *([f"  {'tried before training':<24}{'':>12}  {facts['tried']}"] if facts.get("tried") else []),
        f"  {'predicted step':<24}{chosen.step_ms:>9.0f} ms  "
        f"(forward and backward {chosen.step_ms - chosen.update_ms:.0f} ms, optimizer update {chosen.update_ms:.0f} ms)"
        + busy_host_note(facts.get("load")),
        "",
        f"  {'states on the device':<30}{'micro-batches':>14}{'activation budget':>18}{'host memory':>14}"
        f"{'predicted step':>16}",
    ]
    for option in options:
        outcome = f"{option.step_ms:>13.0f} ms" if option.feasible else f"  {option.reason}"
        mark = "  <- chosen" if option is chosen else ""
        rows.append(f"  {_share(option):<30}{_micro(option, example):>14}{format_bytes(max(option.activation_budget, 0)):>18}"
                    f"{format_bytes(option.host_bytes):>14}{outcome}{mark}")
    return "\n".join(rows)
