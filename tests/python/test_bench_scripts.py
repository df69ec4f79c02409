"""The end-to-end benchmarks that a GPU machine runs also run here, in CPU mode at a small size,
so that a change that breaks them shows up before the rare GPU run does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

E2E = REPO / "bench" / "e2e"


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(E2E / script), *args], capture_output=True, text=True, timeout=900)


def test_the_llama_cycle_benchmark_reports_every_step_per_shape(tmp_path: Path) -> None:
    output = tmp_path / "llama.json"
    done = run_script("llama_cycle_step.py", "--allocator", "stowage", "--device", "cpu", "--tiny", "--cycles", "2",
                      "--warmup-cycles", "1", "--json", str(output))
    assert done.returncode == 0, done.stderr
    result = json.loads(output.read_text())
    assert [step["length"] for step in result["steps"]] == [128, 64, 96, 32] * 2
    assert [step["warm"] for step in result["steps"]] == [False] * 4 + [True] * 4
    assert result["max_reserved"] >= result["max_allocated"] > 0
    assert "seq   128: median" in done.stdout


def test_the_offload_benchmark_offloads_activations_and_reloads_them(tmp_path: Path) -> None:
    output = tmp_path / "offload.json"
    done = run_script("offload_step.py", "--device", "cpu", "--mode", "offload", "--batch", "2", "--seq", "64",
                      "--steps", "2", "--warmup", "1", "--json", str(output))
    assert done.returncode == 0, done.stderr
    result = json.loads(output.read_text())
    result = result[0] if isinstance(result, list) else result
    assert len(result["step_ms"]) == 2
    assert result["offload"]["offload.bytes_offloaded"] > 0
    # Each buffer came back for backward: copied in, or still resident when used (its offload had
    # not finished: on a loaded machine the copy threads can lag this small a step).
    stats = result["offload"]
    assert stats["offload.num_reloads"] + stats["offload.num_still_resident"] > 0
    assert stats["offload.num_reloads"] == 0 or stats["offload.bytes_reloaded"] > 0


def test_the_host_adamw_kernel_keeps_up_with_torch_s_fused_adamw(tmp_path: Path) -> None:
    """adamw_host.py --check: on one core (its CPU time) at least torch's fused AdamW and its
    mixed-precision composition, with a margin for noise; on two threads (the process's CPU time)
    no spinning or oversubscribed threads. The bounds and the healthy figures: CHECK_BOUNDS."""
    output = tmp_path / "check.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "optimizer" / "adamw_host.py"), "--check", "--json",
                           str(output)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(output.read_text())
    assert record["missed"] == []
    assert [(p["threads"], p["clock"]) for p in record["passes"]] == [(1, "cpu"), (2, "process")]
    for measured in record["passes"]:
        assert set(measured["results"]) == {"stream", "torch_fused_fp32", "stowage_fp32", "stowage_fp32_cuda",
                                            "torch_mixed", "stowage_mixed", "stowage_mixed_cuda", "stowage_mixed_fp16"}
        assert all(len(r["all_s"]) == 9 for r in measured["results"].values())
        assert all(measured["ratios"][key] >= bound for key, bound in measured["bounds"].items())


def test_the_optimizer_step_benchmark_times_each_step_and_the_host_update(tmp_path: Path) -> None:
    output = tmp_path / "step.json"
    tiny = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--vocab", "256",
            "--batch", "2", "--seq", "64", "--steps", "2", "--warmup", "1"]
    done = subprocess.run([sys.executable, str(REPO / "bench" / "optimizer" / "adamw_step.py"), *tiny,
                           "--mode", "stowage", "--json", str(output)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(output.read_text())
    assert result["device"] == "cpu-mode" and len(result["steps"]) == 2
    assert all(step["host_update_ms"] > 0 and step["forward_backward_ms"] > 0 for step in result["steps"])
    assert result["host_bytes"] >= 12 * result["parameters"]


def test_the_plan_budget_benchmark_reports_every_repeat_at_every_budget() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "planner" / "plan_budgets.py"), "--repeats", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.rsplit(maxsplit=6) for line in done.stdout.splitlines() if line.strip().endswith(("True", "False"))]
    points = ["full checkpointing", "offload everything", "budget 70%", "budget 50%", "budget 30%"]
    assert [(row[0], row[1]) for row in rows] == [(p, r) for p in points for r in ("0", "1")]
    assert all(row[-1] == "True" for row in rows), "a plan changed the gradients"
    summary = done.stdout.split("budget      plan")[1].splitlines()[1:]
    assert len(summary) == 3 and all(line.count("MiB") >= 4 for line in summary), summary


def test_the_fit_search_finds_more_tokens_with_stowage_than_without(tmp_path: Path) -> None:
    output = tmp_path / "search.json"
    tiny = ["--capacity", "64MiB", "--hidden", "128", "--vocab", "1024", "--seq", "64", "--layers", "4",
            "--max-batch", "64", "--steps", "2", "--searches", "tokens"]
    done = subprocess.run([sys.executable, str(E2E / "fit_search.py"), *tiny, "--configs", "torch",
                           "stowage+plan+optimizer", "--json", str(output)], capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr
    stock, fitted = json.loads(output.read_text())["results"]
    assert stock["most_tokens"] is not None and fitted["most_tokens"] is not None
    assert fitted["most_tokens"]["batch"] > stock["most_tokens"]["batch"]
    # bracketing then bisecting: every point probed once, the answer fits and the next does not
    for result in (stock, fitted):
        batches = [p["batch"] for p in result["probes"]["tokens"]]
        assert len(batches) == len(set(batches))
        answer = result["most_tokens"]["batch"]
        assert any(p["batch"] == answer + 1 and not p["fits"] for p in result["probes"]["tokens"]) or answer == 64
        # each probe says how busy the machine was around it (its time is read against that)
        assert all(len(p["load_before"]) == 3 and len(p["load_after"]) == 3 for p in result["probes"]["tokens"])
    assert "| stowage+plan+optimizer |" in done.stdout


def test_the_gpu_headline_brackets_stock_at_its_prediction_and_fit_past_it(tmp_path: Path) -> None:
    """bench/e2e/gpu_headline.py's tokens part at the dry run's sizes: a calibration on forward and
    backward's own peak predicts stock-with-checkpointing's largest batch, the bracket holds a
    point that fits and the next that does not, and fit is tried at twice the point that fitted."""
    output = tmp_path / "headline.json"
    done = run_script("gpu_headline.py", "--device", "cpu", "--capacity", "48MiB", "--small", "--budget-s", "200",
                      "--parts", "tokens", "--json", str(output))
    assert done.returncode == 0, done.stderr
    tokens = json.loads(output.read_text())["tokens"]
    assert all(p["fits"] and p["backward_peak_bytes"] > 0 for p in tokens["calibration"])
    best = tokens["stock_checkpoint_best"]
    assert best["fits"] and any(not p["fits"] and p["batch"] > best["batch"] for p in tokens["stock_checkpoint_probes"])
    assert tokens["fit"]["batch"] == 2 * best["batch"]


def test_the_batch_arithmetic_benchmark_runs_a_stock_point_and_a_fitted_global_batch() -> None:
    """bench/e2e/fit_batches.py's two kinds of process, at small sizes: a checkpointed stock
    point (4 micro-batches of one row) and stowage.fit choosing micro-batches for a global batch."""
    script = str(E2E / "fit_batches.py")
    point = subprocess.run([sys.executable, script, "--child", "point", "--model", "mlp", "--micro", "2",
                            "--capacity", "256MiB"], capture_output=True, text=True, timeout=300)
    assert point.returncode == 0, point.stderr
    found = json.loads(point.stdout.splitlines()[-1])
    assert found["fits"] and found["blocks"] == 4
    fitted = subprocess.run([sys.executable, script, "--child", "run", "--model", "mlp", "--config", "fit",
                             "--rows", "64", "--micro", "16", "--capacity", "256MiB"], capture_output=True, text=True,
                            timeout=300)
    assert fitted.returncode == 0, fitted.stderr
    run = json.loads(fitted.stdout.splitlines()[-1])
    assert run["units"] == "rows" and len(run["step_s"]) == 3 and run["peak_bytes"] <= run["capacity"]
    assert "<- chosen" in run["table"] and run["departed_steps"] == 0


def test_the_synthetic_solve_benchmark_solves_under_a_budget_that_fits_and_one_that_does_not() -> None:
    script = REPO / "bench" / "planner" / "solve_synthetic.py"
    results = []
    for share in ("1.0", "0.1"):
        done = subprocess.run([sys.executable, str(script), "--tensors", "400", "--share", share, "--repeats", "2"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [r["fits"] for r in results] == [True, False]
    assert all(0 < r["best_s"] <= r["median_s"] for r in results)


def test_the_alias_watch_benchmark_reports_both_watches_on_and_off(tmp_path: Path) -> None:
    output = tmp_path / "watch.json"
    done = run_script("alias_watch_cost.py", "--layers", "1", "--width", "64", "--batch", "2", "--seq", "32",
                      "--steps", "1", "--json", str(output))
    assert done.returncode == 0, done.stderr
    result = json.loads(output.read_text())
    for kind in ("offload", "recompute"):
        assert len(result[kind]["step_ms"]["on"]) == len(result[kind]["step_ms"]["off"]) == 1
        assert result[kind]["watch_ms"][0] > 0  # the watch ran, and was timed


def test_the_host_update_benchmark_matches_torch_s_bits_and_reports_fit_s_prediction(tmp_path: Path) -> None:
    output = tmp_path / "host_update.json"
    done = run_script("host_update_step.py", "--device", "cpu", "--layers", "2", "--width", "64", "--vocab", "256",
                      "--batch", "2", "--seq", "32", "--steps", "2", "--rounds", "1", "--json", str(output))
    assert done.returncode == 0, done.stderr
    result = json.loads(output.read_text())
    assert result["largest_difference"] == 0.0
    assert result["fit"]["optimizer"] == "stowage.offload.adam.AdamW" and result["fit"]["update_ms"] > 0
    assert all(len(result["runs"][mode][0]["update_ms"]) == 2 for mode in ("torch_forloop", "stowage"))


def test_the_parameters_benchmark_trains_both_ways_to_the_same_bits(tmp_path: Path) -> None:
    output = tmp_path / "parameters.json"
    done = run_script("parameters_step.py", "--device", "cpu", "--layers", "2", "--width", "64", "--vocab", "256",
                      "--batch", "2", "--seq", "32", "--steps", "2", "--rounds", "1", "--json", str(output))
    assert done.returncode == 0, done.stderr
    result = json.loads(output.read_text())
    assert result["largest_difference"] == 0.0
    plain, offloaded = result["summary"]["plain"], result["summary"]["parameters"]
    assert offloaded["host_parameter_bytes"] > 0
    assert offloaded["between_steps_bytes"] < plain["between_steps_bytes"]
