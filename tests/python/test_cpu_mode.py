"""CPU mode: real PyTorch models on stowage's allocator over a capped simulated device."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import stowage  # noqa: E402

ROUND = 512


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter: CPU mode is per process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module", autouse=True)
def cpu_mode():
    stowage.enable(device="cpu", capacity="4GiB")
    yield
    stowage.disable()


def storages(*groups) -> list[torch.UntypedStorage]:
    seen: dict[int, torch.UntypedStorage] = {}
    for group in groups:
        for tensor in group:
            if torch.is_tensor(tensor) and tensor.untyped_storage().nbytes() > 0:
                seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage()
    return list(seen.values())


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]


def check_accounting(live: list[torch.UntypedStorage]) -> None:
    """stowage holds exactly the live storages: one allocated block each, of their sizes."""
    gc.collect()  # earlier tests' unreachable cycles (a first import's frames) are not live
    stats = stowage.memory_stats()
    assert stats["requested_bytes.all.current"] == sum(s.nbytes() for s in live)
    assert stats["allocation.all.current"] == len(live)
    blocks = {block["address"]: block for segment in stowage.snapshot()["segments"]
              for block in segment["blocks"] if block["state"] == "active_allocated"}
    assert {s.data_ptr(): s.nbytes() for s in live} == {a: b["requested_size"] for a, b in blocks.items()}
    assert stowage.memory_allocated() == sum(block["size"] for block in blocks.values())
    assert all(block["size"] >= -(-block["requested_size"] // ROUND) * ROUND for block in blocks.values())


@pytest.mark.parametrize("kind", ["cnn", "transformer"])
def test_after_each_step_only_the_model_and_optimizer_hold_memory(kind: str) -> None:
    torch.manual_seed(0)
    if kind == "cnn":
        model = torchvision.models.resnet18(num_classes=10)
        batch = lambda: torch.randn(4, 3, 64, 64)  # noqa: E731
    else:
        model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2)
        batch = lambda: torch.randn(4, 16, 64)  # noqa: E731
    optimizer = torch.optim.AdamW(model.parameters())
    held = torch.ones(1000)  # a tensor the test holds across steps
    for _ in range(3):
        model(batch()).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        check_accounting(storages(model.parameters(), model.buffers(), state_tensors(optimizer), [held]))
    assert stowage.memory_reserved() >= stowage.memory_allocated()
    assert stowage.max_memory_allocated() >= stowage.memory_allocated()


def test_the_snapshot_shows_the_live_tensors_and_memory_viz_reads_it(tmp_path) -> None:
    from torch.cuda import _memory_viz

    stowage.record_history(True)
    kept = [torch.empty(n, dtype=torch.uint8) for n in (1000, 5000, 3 << 20)]
    dropped = torch.empty(777, dtype=torch.uint8)
    del dropped
    snapshot = stowage.snapshot()
    active = {block["address"]: block for segment in snapshot["segments"] for block in segment["blocks"]
              if block["state"] == "active_allocated"}
    for tensor in kept:
        block = active[tensor.data_ptr()]
        assert block["requested_size"] == tensor.nbytes
        assert block["size"] == -(-tensor.nbytes // ROUND) * ROUND
        assert any(frame["name"] == "<listcomp>" or "test_the_snapshot" in frame["name"]
                   for frame in block["frames"]), block["frames"]
    actions = [entry["action"] for entry in snapshot["device_traces"][0]]
    assert "alloc" in actions and "free_completed" in actions
    for segment in snapshot["segments"]:
        assert sum(block["size"] for block in segment["blocks"]) == segment["total_size"]
    path = tmp_path / "cpu.pickle"
    stowage.dump_snapshot(path)
    assert _memory_viz.segsum(snapshot)
    assert _memory_viz.trace(snapshot)
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()
    stowage.record_history(False)


def test_history_with_torchs_default_bound_keeps_every_event() -> None:
    # torch.cuda.memory._record_memory_history's default: max_entries=sys.maxsize, keep everything.
    stowage.record_history(True, stacks="all", max_entries=sys.maxsize)
    try:
        kept = [torch.empty(1000 + i, dtype=torch.uint8) for i in range(300)]
        allocs = [entry for entry in stowage.snapshot()["device_traces"][0]
                  if entry["action"] == "alloc" and entry["addr"] in {t.data_ptr() for t in kept}]
        assert len(allocs) == len(kept)
    finally:
        stowage.record_history(False)


def test_the_summary_has_torchs_layout() -> None:
    summary = stowage.memory_summary()
    assert "Allocated memory" in summary and "from large pool" in summary
    assert all(len(line) == 77 for line in summary.splitlines())


def test_out_of_memory_is_torchs_error_and_training_goes_on() -> None:
    result = run_python("""
        import torch, stowage
        stowage.enable(device="cpu", capacity="64MiB")
        held = [torch.empty(16 << 20, dtype=torch.uint8) for _ in range(3)]
        try:
            torch.empty(32 << 20, dtype=torch.uint8)
            raise SystemExit("no OOM")
        except torch.OutOfMemoryError as error:
            caught, message = error, str(error)
        opening = ("CPU out of memory. Tried to allocate 32.00 MiB. The simulated device has a total "
                   "capacity of 64.00 MiB of which 16.00 MiB is free. ")
        assert message.startswith(opening) and "stowage:" in message, message
        # Tools that catch an OOM by its text (accelerate's find_executable_batch_size) see one.
        from accelerate.utils.memory import should_reduce_batch_size
        assert should_reduce_batch_size(caught), caught.args
        assert stowage.memory_stats()["num_ooms"] == 1
        del held
        after = torch.empty(32 << 20, dtype=torch.uint8)
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_forking_dataloader_works_and_the_interpreter_exits_cleanly() -> None:
    result = run_python("""
        import torch, stowage
        stowage.enable(device="cpu", capacity="1GiB")
        data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64))
        loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2,
                                             multiprocessing_context="fork")
        total = sum(float(x.sum()) for x, _ in loader)
        print("batches", len(loader))
    """)
    assert result.returncode == 0, result.stderr
    assert "batches 8" in result.stdout


def test_intra_op_threads_and_a_second_python_thread_allocate_at_once() -> None:
    result = run_python("""
        import threading, torch, stowage
        torch.set_num_threads(2)
        stowage.enable(device="cpu", capacity="2GiB")
        stowage.record_history(True, stacks="all")
        def worker():
            for _ in range(200):
                torch.randn(256, 256) @ torch.randn(256, 256)
        thread = threading.Thread(target=worker)
        thread.start()
        for _ in range(200):
            torch.randn(512, 64).sum(dim=0)
        thread.join()
        assert stowage.memory_stats()["num_invalid_frees"] == 0
        assert stowage.snapshot()["device_traces"][0]
        print("ok")
    """)
    assert result.returncode == 0, result.stderr


def test_disable_hands_new_tensors_back_to_torch() -> None:
    before = stowage.memory_stats()["allocation.all.allocated"]
    kept = torch.empty(4096)
    stowage.disable()
    assert not stowage.is_enabled()
    other = torch.empty(4096)
    assert stowage.memory_stats()["allocation.all.allocated"] == before + 1
    del kept  # still freed by stowage after disable
    assert stowage.memory_stats()["allocation.all.freed"] >= 1
    stowage.enable(device="cpu", capacity="4GiB")
    assert stowage.is_enabled()
    del other


def test_bad_arguments_are_clear() -> None:
    with pytest.raises(ValueError, match="needs a capacity"):
        stowage.enable(device="cpu")
    with pytest.raises(ValueError, match="cannot change now"):
        stowage.enable(device="cpu", capacity="1GiB")
    with pytest.raises(ValueError, match="unknown key"):
        stowage.enable("nonsense:1", device="cpu", capacity="4GiB")
    with pytest.raises(ValueError, match="stacks must be"):
        stowage.record_history(True, stacks="perl")


def test_stowage_record_runs_a_script_and_writes_its_snapshot(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        model = torch.nn.Linear(32, 32)
        for _ in range(3):
            model(torch.randn(8, 32)).sum().backward()
        assert sys.argv[1:] == ["--steps", "3"]
    """))
    out = tmp_path / "train.pickle"
    result = subprocess.run([sys.executable, "-m", "stowage", "record", "--capacity", "1GiB", "-o", str(out),
                             "--", "python", str(script), "--steps", "3"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    from stowage.snapshot_reader import load_snapshot

    snapshot = load_snapshot(out)
    allocs = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    assert allocs and any(frame["filename"] == str(script) for e in allocs for frame in e["frames"])
    replayed = subprocess.run([sys.executable, "-m", "stowage", "replay", str(out), "--json"],
                              capture_output=True, text=True)
    assert replayed.returncode == 0, replayed.stderr


def test_history_keeps_an_exception_raised_while_tensors_are_freed() -> None:
    result = run_python("""
        import torch, stowage
        stowage.enable(device="cpu", capacity="1GiB")
        stowage.record_history(True)
        def boom():
            return [torch.empty(10) for _ in range(3)] + [1 / 0]
        try:
            boom()
        except ZeroDivisionError:
            print("caught")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "caught"


def test_forking_with_history_on_while_another_thread_allocates() -> None:
    result = run_python("""
        import os, threading, torch, stowage
        stowage.enable(device="cpu", capacity="1GiB")
        stowage.record_history(True)
        stop = False
        def churn():
            while not stop:
                torch.empty(1000)
        thread = threading.Thread(target=churn)
        thread.start()
        for _ in range(60):
            pid = os.fork()
            if pid == 0:
                torch.empty(100)
                os._exit(0)
            os.waitpid(pid, 0)
        stop = True
        thread.join()
        print("ok")
    """, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_enable_and_disable_alternate_as_often_as_asked() -> None:
    result = run_python("""
        import torch, stowage
        for cycle in range(300):
            stowage.enable(device="cpu", capacity="1GiB")
            before = stowage.memory_stats()["allocation.all.allocated"]
            kept = torch.empty(100)
            assert stowage.memory_stats()["allocation.all.allocated"] == before + 1, cycle
            stowage.disable()
            other = torch.empty(100)
            assert stowage.memory_stats()["allocation.all.allocated"] == before + 1, cycle
        print("ok")
    """)
    assert result.returncode == 0, result.stderr


def test_the_profiler_sees_allocations_in_cpu_mode() -> None:
    from stowage.profiler_snapshot import profiled_snapshot

    trace = profiled_snapshot(lambda step: torch.empty(1000), 2)["device_traces"][0]
    assert sum(1 for e in trace if e["action"] == "alloc" and e["size"] >= 4000) >= 2


def test_learned_placement_trains_the_same_model_and_mark_step_reaches_history_and_replay(tmp_path) -> None:
    snapshot = tmp_path / "steps.pickle"
    result = run_python(f"""
        import pickle, torch, stowage
        from stowage.replay import device_events

        def train(steps, mark):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                        torch.nn.Linear(2048, 2048), torch.nn.GELU(),
                                        torch.nn.Linear(2048, 512))
            optimizer = torch.optim.AdamW(model.parameters())
            data = torch.randn(256, 512)
            losses = []
            for _ in range(steps):
                loss = model(data).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss.item())
                if mark:
                    stowage.mark_step()
            return losses

        expected = train(8, mark=False)          # torch's own CPU allocator
        stowage.mark_step()                      # not enabled: does nothing
        stowage.enable("placement:learned", device="cpu", capacity="2GiB")
        stowage.record_history(True)
        losses = train(8, mark=True)
        status = stowage.placement_status()
        snap = stowage.snapshot()
        stowage.record_history(False)
        marks = [e for e in snap["device_traces"][0] if e.get("user_metadata") == "stowage.mark_step"]
        pickle.dump(snap, open({str(snapshot)!r}, "wb"), protocol=4)
        replayed = device_events(snap["device_traces"][0]).replay(1 << 32, "placement:learned", False)
        old_names = ("plans_made", "plan_live_bytes", "planned_allocations")
        aliases = any(name in d for d in (status, replayed) for name in old_names)
        print(losses == expected, status["phase"], status["layouts_made"], status["placed_allocations"] > 0,
              len(marks), marks[0]["action"], replayed["layouts_made"], replayed["placed_allocations"] > 0,
              aliases)
    """)
    assert result.returncode == 0, result.stderr
    same, phase, layouts, placed, marks, action, replay_layouts, replay_placed, aliases = result.stdout.split()
    assert same == "True"  # placement changes addresses, never values
    assert (phase, layouts, placed) == ("placed", "1", "True")
    assert (marks, action) == ("8", "snapshot")
    assert int(replay_layouts) >= 1 and replay_placed == "True"
    # Only the layout's names, in placement_status() and in replay results.
    assert aliases == "False"
    # The command line replays it too, with the marks.
    replayed = subprocess.run([sys.executable, "-m", "stowage", "replay", str(snapshot), "--json",
                               "--config", "placement:learned"], capture_output=True, text=True,
                              timeout=120)
    assert replayed.returncode == 0, replayed.stderr
    assert '"placed_allocations"' in replayed.stdout
