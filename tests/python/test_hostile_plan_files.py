"""Hostile profiles, sized profiles and plans, as measured in the issue "Hostile input, bounded
resources, and no stuck states": each ends in a refusal naming the file, the field, the value
and the bound (``stowage plan`` exits 2; 1 means only "no plan fits"), never a traceback, a
pybind message, or a solve sized by the file; and a ``with plan:`` that raises leaves the plan
inactive."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from plan_files_fuzzer import small_profile, small_sized

import stowage.plan
from stowage.plan import command
from stowage.validation import InputError

RECORDED = Path(__file__).parent / "data" / "gpt_step.lifetimes.json"


def plan_command(*argv: str) -> tuple[int, str]:
    """``stowage plan ARGV`` in this process: (exit status, stderr)."""
    import argparse

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers(dest="command"), "plan")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        status = command.run(parser.parse_args(["plan", *argv]))
    return status, err.getvalue()


def written(tmp_path: Path, document: Any, name: str = "profile.json") -> Path:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def recorded() -> dict[str, Any]:
    return json.loads(RECORDED.read_text())


def changed(document: dict[str, Any], change: Any) -> dict[str, Any]:
    document = copy.deepcopy(document)
    change(document)
    return document


# (name, change to the recorded profile, what the refusal names)
REFUSED = [
    ("deep prefetch", lambda d: d["cost"].update(prefetch_depth=100_000),
     "cost.prefetch_depth: 100000 is above 38, the trace's saved tensors"),
    ("deepest prefetch", lambda d: d["cost"].update(prefetch_depth=2**31 - 1), "cost.prefetch_depth: 2147483647"),
    ("null prefetch", lambda d: d["cost"].update(prefetch_depth=None),
     "cost.prefetch_depth: expected an integer, got null"),
    ("1e30 prefetch", lambda d: d["cost"].update(prefetch_depth=1e30), "cost.prefetch_depth: expected an integer"),
    ("empty cost", lambda d: d.update(cost={}), "cost: missing field 'to_host_bytes_per_ms'"),
    ("2**62 bytes", lambda d: d["tensors"][0].update(bytes=2**62), "tensors[0].bytes: 4611686018427387904 is above"),
    ("1e30 peak", lambda d: d.update(unconstrained_peak_bytes=1e30), "unconstrained_peak_bytes: expected an integer"),
    ("no region 99", lambda d: d["tensors"][5].update(region=99),
     "tensors[5].region: 99 is above 3, the trace's last checkpoint region"),
    ("a string for bytes", lambda d: d["tensors"][2].update(bytes="12"), "tensors[2].bytes: expected an integer"),
    ("a list for a name", lambda d: d["ops"][7].update(name=[1]), "ops[7].name: expected a string, got a list"),
    ("NaN duration", lambda d: d["ops"][3].update(duration_ms=float("nan")), "not JSON"),
    ("unknown field", lambda d: d["ops"][0].update(extra=1), "ops[0]: unknown field 'extra'"),
    ("slow link", lambda d: d["cost"].update(to_host_bytes_per_ms=1e-9), "cost.to_host_bytes_per_ms: 1e-09 is below"),
    ("op out of its region", lambda d: d["ops"][4].update(region_op=99), "ops[4].region_op: 99 is not an op of region"),
    ("a lone surrogate in a name", lambda d: d["tensors"][1].update(module="blocks.\ud800"),
     "tensors[1].module: a string that is not text: it holds a lone surrogate"),
]


@pytest.mark.parametrize("name, change, said", REFUSED, ids=[case[0] for case in REFUSED])
def test_a_hostile_profile_is_refused_naming_the_field_and_the_bound(tmp_path: Path, name: str, change: Any,
                                                                        said: str) -> None:
    path = written(tmp_path, json.dumps(changed(recorded(), change)))
    status, err = plan_command(str(path), "--budget", "50%")
    assert status == 2, err
    assert err.startswith(f"stowage plan: {path}: "), err
    assert said in err, err
    assert "incompatible function arguments" not in err and "Traceback" not in err


@pytest.mark.parametrize("budget, said", [("inf%", "not a finite percentage"), ("nan%", "not a finite percentage"),
                                          ("9" * 20, "--budget must be from 0 to 2**60 bytes"),
                                          ("0%", "above 0%"), ("0", "positive"), ("1e400%", "not a finite")])
def test_a_budget_out_of_bounds_exits_2_naming_it(budget: str, said: str) -> None:
    status, err = plan_command(str(RECORDED), "--budget", budget)
    assert status == 2 and said in err, err


def test_deep_or_dense_json_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    status, err = plan_command(str(written(tmp_path, "[" * 100_000 + "]" * 100_000)), "--budget", "1GiB")
    assert status == 2 and "lists and objects in 200,000 bytes" in err, err
    # Nested past json's own limit but sparse: refused as nested, not a RecursionError.
    status, err = plan_command(str(written(tmp_path, "[ " * 5000 + " ]" * 5000 + " " * 400_000)), "--budget", "1GiB")
    assert status == 2 and "nested deeper than JSON is read" in err, err


def test_a_sized_profile_whose_grid_would_exhaust_memory_is_refused_from_its_sizes(tmp_path: Path) -> None:
    """8 sizes of 39 points: 5e12 grid points, refused before any grid is built (1.3 KB)."""
    document = {"format": "stowage-sized-lifetimes", "version": 1,
                "sizes": {f"s{i}": list(range(1, 40)) for i in range(8)}, "profiles": []}
    status, err = plan_command(str(written(tmp_path, document)), "--budget", "1GiB", "--at", "s0=1")
    assert status == 2 and "sizes.s0: a list of 39 items is above 8" in err, err
    document["sizes"] = {f"s{i}": [1, 2, 3, 4, 5, 6, 7, 8] for i in range(3)}
    status, err = plan_command(str(written(tmp_path, document)), "--budget", "1GiB", "--at", "s0=1")
    assert status == 2 and "a grid of 512 points is above 256" in err, err


def test_a_sized_profile_planned_far_beyond_its_grid_is_refused(tmp_path: Path) -> None:
    """Byte counts growing with the square of the sequence, planned at a sequence of 2**31 - 1:
    beyond any device, refused rather than handed to the solver."""
    assert plan_command(str(written(tmp_path, small_sized())), "--budget", "50%", "--at", "batch=8")[0] == 0
    document = {"format": "stowage-sized-lifetimes", "version": 1, "sizes": {"seq": [2, 4, 8]},
                "profiles": [small_profile(scale=seq * seq) for seq in (2, 4, 8)]}
    path = written(tmp_path, document, "quadratic.json")
    assert plan_command(str(path), "--budget", "50%", "--at", "seq=16")[0] == 0
    status, err = plan_command(str(path), "--budget", "50%", "--at", f"seq={2**31 - 1}")
    assert status == 2 and "far beyond those recorded" in err, err


def test_the_command_exits_2_without_a_traceback_in_a_fresh_process(tmp_path: Path) -> None:
    path = written(tmp_path, changed(recorded(), lambda d: d["cost"].update(prefetch_depth=None)))
    done = subprocess.run([sys.executable, "-m", "stowage", "plan", str(path), "--budget", "50%"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


# --- plans ---


def saved_plan(tmp_path: Path, change: Any = None) -> Path:
    profile = stowage.plan.load_trace(RECORDED)
    plan = stowage.plan.solve(profile, int(profile.unconstrained_peak_bytes * 0.5))
    path = tmp_path / "plan.json"
    plan.save(path)
    if change is not None:
        path.write_text(json.dumps(changed(json.loads(path.read_text()), change)))
    return path


def test_a_plan_whose_tensor_names_a_region_that_does_not_exist_is_refused_at_load(tmp_path: Path) -> None:
    path = saved_plan(tmp_path, lambda d: d["profile"]["tensors"][5].update(region=7))
    with pytest.raises(InputError, match=r"profile\.tensors\[5\]\.region: 7 is above 3"):
        stowage.plan.load(path)


def test_a_plan_recomputing_a_tensor_of_no_region_is_refused_at_load(tmp_path: Path) -> None:
    """Region -1 once checkpointed the last region (regions[-1]) silently."""
    def recompute_outside(document: dict[str, Any]) -> None:
        document["decisions"][0] = "recompute"  # tensor 0 is of no region
    with pytest.raises(InputError, match=r"decisions\[0\]: 'recompute' for a tensor that cannot be recomputed"):
        stowage.plan.load(saved_plan(tmp_path, recompute_outside))


def test_a_plan_the_runtime_cannot_apply_is_refused_when_made_and_its_decisions_stay_as_checked() -> None:
    import copy

    profile = stowage.plan.load_trace(RECORDED)
    recomputed = next(t for t, tensor in enumerate(profile.tensors) if tensor.recomputable)
    decisions = [stowage.plan.Decision.keep] * len(profile.tensors)
    decisions[recomputed] = stowage.plan.Decision.recompute
    for region, said in ((9, f"saved tensor {recomputed} .*region 9 is not one of"), (-1, "cannot be recomputed")):
        edited, tensors = copy.copy(profile), profile.tensors
        tensors[recomputed].region = region
        edited.tensors = tensors
        with pytest.raises(ValueError, match=said):
            stowage.plan.Plan(edited, decisions, 1 << 30)
    plan = stowage.plan.solve(profile, int(profile.unconstrained_peak_bytes * 0.5))
    before = plan.decisions
    plan.decisions[recomputed] = stowage.plan.Decision.offload  # a copy's
    assert plan.decisions == before  # the plan keeps the decisions it checked


def test_a_plan_made_of_anything_but_decisions_is_refused_naming_the_first() -> None:
    profile = stowage.plan.load_trace(RECORDED)
    Decision = stowage.plan.Decision
    for decisions, said in ((["keep"] * len(profile.tensors), "decision 0 is 'keep', not a stowage.plan.Decision"),
                            ([Decision.keep, "x" * 10_000], "decision 1 is 'xxxx"),
                            ([Decision.keep, 1], "decision 1 is 1, not")):
        with pytest.raises(ValueError, match=said) as refused:
            stowage.plan.Plan(profile, decisions, 1 << 30)
        assert len(str(refused.value)) < 200


def test_a_with_plan_that_raises_on_the_way_in_leaves_the_plan_inactive(monkeypatch: pytest.MonkeyPatch) -> None:
    import stowage.plan.applying

    class Refusing:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("no offloader here")

    profile = stowage.plan.load_trace(RECORDED)
    plan = stowage.plan.solve(profile, int(profile.unconstrained_peak_bytes * 0.5))
    monkeypatch.setattr(stowage.plan.applying, "SavedTensorOffload", Refusing)
    for _ in range(2):  # the same refusal each time: never "already applied"
        with pytest.raises(RuntimeError, match="no offloader here"):
            with plan:
                pass
        assert not plan._active


def test_a_plan_mixing_recompute_and_offload_in_one_region_is_refused_at_load(tmp_path: Path) -> None:
    document = json.loads(saved_plan(tmp_path).read_text())
    tensors = document["profile"]["tensors"]
    region = next(t["region"] for t in tensors if t["region"] >= 0 and t["recomputable"])
    members = [i for i, t in enumerate(tensors) if t["region"] == region and t["recomputable"]]
    document["decisions"][members[0]] = "recompute"
    document["decisions"][members[1]] = "offload"
    with pytest.raises(InputError, match="a region recomputes or offloads, never both"):
        stowage.plan.load(written(tmp_path, document, "mixed.json"))


def test_names_from_a_profile_are_printed_literally(tmp_path: Path) -> None:
    document = small_profile()
    for tensor in document["tensors"]:
        tensor["module"] = "exp[v2]\x1b]0;title\x07.[/bold]"
    done = subprocess.run([sys.executable, "-m", "stowage", "plan", str(written(tmp_path, document)), "--budget",
                           "50%"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "exp[v2]\\x1b]0;title\\x07" in done.stdout


@pytest.mark.parametrize(("depth", "said"), [(10 ** 5, "is above 38, the trace's saved tensors"),
                                             (-1, "is below 0")])
def test_solve_checks_the_cost_it_is_given_as_it_checks_a_file(depth: int, said: str) -> None:
    profile = stowage.plan.load_trace(RECORDED)
    with pytest.raises(InputError, match=f"stowage.plan.solve: cost.prefetch_depth: {depth} {said}"):
        stowage.plan.solve(profile, profile.unconstrained_peak_bytes // 2, prefetch_depth=depth)
