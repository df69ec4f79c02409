"""The rest of the issue "Hostile input, bounded resources, and no stuck states", one test a
reproduction: snapshots that flood memory or hide a second pickle, strings from a snapshot that
would act on a terminal, a wait for copies the user interrupts, enable() for a device that is
not there, and knobs out of their bounds."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import event, stowage

from stowage.snapshot_reader import SnapshotError, load_snapshot, load_snapshot_columnar
from stowage.snapshot_reader.loading import COLUMNS_MEMORY_PER_BYTE, MEMORY_FLOOR

MiB = 1 << 20
HAS_GPU = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(torch.cuda.device_count() == 0)"],
                         capture_output=True).returncode == 0


def peak_resident_of(code: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], int]:
    """Runs `code` in a fresh interpreter (with `env` added to the environment); its result and its
    peak resident memory in bytes (VmHWM: ru_maxrss keeps the parent's across fork and exec, which
    in the suite is pytest's)."""
    wrapped = code + ("\nprint('peak', next(int(line.split()[1]) for line in open('/proc/self/status') "
                      "if line.startswith('VmHWM')))")
    done = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    peak = [line for line in done.stdout.splitlines() if line.startswith("peak ")]
    return done, int(peak[-1].split()[1]) * 1024 if peak else 0


def read_columnar_in_a_process(paths: list[Path], env: dict[str, str] | None = None) -> tuple[
        subprocess.CompletedProcess[str], int]:
    """Each file read into columns in one fresh process, each refusal printed ("refused: ...");
    (the finished process, its peak resident bytes)."""
    return peak_resident_of(textwrap.dedent(f"""
        from stowage.snapshot_reader import SnapshotError, load_snapshot_columnar
        for path in {[str(path) for path in paths]!r}:
            try:
                load_snapshot_columnar(path)
            except SnapshotError as error:
                print("refused:", error)
    """), env)


def test_a_file_of_one_repeated_opcode_is_refused_within_its_memory_bound(tmp_path: Path) -> None:
    """20 MiB of EMPTY_LIST reached 1.5 GB (75 times the file) before it was refused; now the
    reading stops once it grew memory by its budget, within 200 MB and 13 times the file (96 MiB
    and 12 bytes a byte: an EMPTY_DICT makes a dict)."""
    paths = []
    for name, opcode in (("EMPTY_LIST", b"]"), ("EMPTY_DICT", b"}")):
        paths.append(tmp_path / f"{name}.pickle")
        paths[-1].write_bytes(b"\x80\x04" + opcode * ((20 * MiB) // len(opcode)) + b".")
    done, peak = read_columnar_in_a_process(paths)
    assert done.stdout.count("refused:") == len(paths), done.stdout + done.stderr
    assert done.stdout.count("grew memory by more than") == len(paths), done.stdout
    assert peak < 200 * MiB + 13 * 20 * MiB, peak


def hostile_ints(path: Path, size: int) -> Path:
    """A pickle of one list of `size` bytes' worth of int objects (1,000 a batch): 8 bytes of
    objects a byte of pickle, as no snapshot holds, a file as large as wanted."""
    batch = b"(" + b"J\x00\x00\x00\x40" * 1000 + b"e"
    path.write_bytes(b"\x80\x04]" + batch * ((size - 4) // len(batch)) + b".")
    return path


def test_a_large_hostile_file_is_refused_within_the_ceiling_not_its_share(tmp_path: Path) -> None:
    """A 1.5 GB file reached 6 GB before its refusal: the share a byte of pickle (then 3 bytes)
    grew with the file. A ceiling holds any file's reading (768 MiB; a 1.5 GB one is refused within
    1 GB of memory: bench/results/2026-11-28-hostile-inputs.md); here a 64 MiB ceiling set through
    STOWAGE_SNAPSHOT_MEMORY holds a 40 MB file whose share alone would be 480 MiB."""
    path = hostile_ints(tmp_path / "ints.pickle", 40_000_000)
    done, peak = read_columnar_in_a_process([path], {"STOWAGE_SNAPSHOT_MEMORY": "64MiB"})
    assert "grew memory by more than 64 MiB" in done.stdout and "at most 64 MiB" in done.stdout, done.stdout
    _, interpreter = peak_resident_of("import stowage.snapshot_reader")
    assert peak < interpreter + 64 * MiB + 24 * MiB, (peak / MiB)  # a check every 256 KiB of pickle


def test_the_ceiling_knob_is_held_to_its_bounds() -> None:
    for value, said in (("12", "STOWAGE_SNAPSHOT_MEMORY must be a size from 16MiB to 1TiB, not '12'"),
                        ("lots", "STOWAGE_SNAPSHOT_MEMORY: ")):
        done = subprocess.run([sys.executable, "-c", "from stowage.snapshot_reader import loads_snapshot\n"
                               "loads_snapshot(b'\\x80\\x04}.')"], capture_output=True, text=True,
                              env={**os.environ, "STOWAGE_SNAPSHOT_MEMORY": value})
        assert done.returncode != 0 and said in done.stderr, done.stderr


def distinct_frames(path: Path, events: int) -> Path:
    """A valid snapshot whose every event has a stack frame of its own, as dense as torch writes a
    trace (a dict a frame): 200,000 events make 16 MB."""
    trace = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": i,
              "frames": [{"filename": f"/src/m{i}.py", "line": i % 1000, "name": f"f{i}"}]} for i in range(events)]
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    return path


def test_a_snapshot_of_distinct_frames_is_read_up_to_the_documented_size(tmp_path: Path) -> None:
    """200,000 distinct frames in 16 MB (and 300,000 in 24) were refused by the reading's memory
    bound (3 bytes a byte; they take 10); 12 bytes a byte reads them, up to 56 MB within the
    ceiling."""
    path = distinct_frames(tmp_path / "frames.pickle", 200_000)
    done = stowage("inspect", str(path), "--top", "1")
    assert done.returncode == 0, done.stderr
    assert "200,000 trace events" in done.stdout


def test_a_denser_snapshot_than_the_ceiling_allows_is_refused_naming_the_knob_and_the_command(tmp_path: Path) -> None:
    """The refusal named load_snapshot_columnar "as stowage inspect does" to stowage inspect itself;
    it now says what to give the command that read it, and load_snapshot's names the columnar
    loader."""
    path = distinct_frames(tmp_path / "frames.pickle", 50_000)
    done = subprocess.run([sys.executable, "-m", "stowage", "inspect", str(path), "--top", "1"], capture_output=True,
                          text=True, env={**os.environ, "STOWAGE_SNAPSHOT_MEMORY": "32MiB"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "at most 32 MiB): refused" in done.stderr, done.stderr
    assert f"raise the ceiling: STOWAGE_SNAPSHOT_MEMORY=2GiB stowage inspect {path} --top 1" in done.stderr
    assert "as stowage inspect does" not in done.stderr
    with pytest.raises(SnapshotError, match="load_snapshot_columnar, which stowage inspect, diff and replay read "
                                            "with, takes a fraction"):
        load_snapshot(hostile_ints(tmp_path / "ints.pickle", 40_000_000))


def test_a_long_list_is_walked_within_the_memory_bound(tmp_path: Path) -> None:
    """A list of 16 million Nones (and one of 9 million references to one list) keeps the reading
    within its budget, 8 bytes an item; the walk of what it built once copied the list's children
    twice over (24 bytes an item), and 20 MiB reached 536 MiB. It takes them a few at a time."""
    paths = []
    for name, items, item, first in (("none", 16_000_000, b"N", b""), ("shared", 9_000_000, b"h\x00", b"]\x94a")):
        batch = b"(" + item * 1000 + b"e"
        pad = 20 * MiB - 15 - len(first) - items // 1000 * len(batch)
        paths.append(tmp_path / f"{name}.pickle")
        paths[-1].write_bytes(b"\x80\x04]" + first + b"\x8d" + pad.to_bytes(8, "little") + b"x" * pad + b"a"
                              + batch * (items // 1000) + b".")
    done, peak = read_columnar_in_a_process(paths)
    assert done.stdout.count("snapshot: expected dict, got list") == len(paths), done.stdout + done.stderr
    assert peak < 200 * MiB + 4 * 20 * MiB, peak / MiB


def test_a_pickle_read_twice_keeps_both_readings_within_one_budget(tmp_path: Path) -> None:
    """Events laid out unlike torch's writer (one written twice) are read into columns, then again
    as plain data: what the first reading left in the process counts against the second's budget,
    so that the two together stay within one (the second alone reached 170 MiB over the start at
    11 MiB, where the budget is 130)."""
    path = tmp_path / "twice.pickle"
    events = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": i,
               "frames": [{"filename": "/src/train.py", "line": i % 50, "name": "step"}]} for i in range(233_000)]
    events.append(events[0])
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4))
    done, peak = peak_resident_of(textwrap.dedent(f"""
        import os
        from stowage.snapshot_reader import SnapshotError, load_snapshot_columnar
        print("start", int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
        try:
            load_snapshot_columnar({str(path)!r})
        except SnapshotError as error:
            print("refused:", error)
    """), {"STOWAGE_SNAPSHOT_MEMORY": "130MiB"})  # (the budget the two readings would share at 3 a byte)
    assert "grew memory by more than" in done.stdout, done.stdout + done.stderr
    start = int(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("start ")))
    budget = min(MEMORY_FLOOR + COLUMNS_MEMORY_PER_BYTE * path.stat().st_size, 130 * MiB)
    assert peak - start < budget + 24 * MiB, (peak - start) / MiB  # a check every 256 KiB of pickle


def test_concatenated_pickles_are_refused_like_concatenated_gzip(write_snapshot) -> None:
    one = pickle.dumps({"segments": [], "device_traces": [[event("alloc", 1, 2)]]}, protocol=4)
    path = write_snapshot(one + one)
    for load in (load_snapshot, load_snapshot_columnar):
        with pytest.raises(SnapshotError, match=r"bytes after the pickle's end .* a snapshot is one pickle"):
            load(path)
    done = stowage("inspect", str(path))
    assert done.returncode == 2 and "several files joined" in done.stderr and "Traceback" not in done.stderr


HOSTILE_FRAMES = [
    {"filename": "exp[v2]/train.py", "line": 3, "name": "step"},
    {"filename": "bold.py", "line": 4, "name": "[/bold]"},
    {"filename": "screen.py", "line": 5, "name": "\x1b[2J\x1b]0;pwned\x07"},
    {"filename": "link.py", "line": 6, "name": "[link=https://example.com]click[/link]"},
    {"filename": "rtl.py", "line": 7, "name": "\u202eevil"},
    {"filename": "lone\ud800.py", "line": 8, "name": "nul\x00del\x7fcsi\x9b2J"},
    {"filename": "tag.py", "line": 9, "name": "</td><script>alert(1)</script>"},
]
# What each shows as, on a terminal and in the HTML report (there HTML-escaped as well).
SHOWN = ("exp[v2]/train.py", "[/bold]", "[link=https://example.com]click[/link]", "\\x1b[2J\\x1b]0;pwned\\x07",
         "\\u202eevil", "lone\\ud800.py", "nul\\x00del\\x7fcsi\\x9b2J")
# Bytes no output may hold: ESC, BEL, NUL, DEL, C1's CSI, U+202E, a lone surrogate (as surrogatepass writes it).
RAW = (b"\x1b", b"\x07", b"\x00", b"\x7f", "\x9b".encode(), "\u202e".encode(), b"\xed\xa0\x80")


def hostile_snapshot(write_snapshot) -> tuple[Path, Path]:
    """A snapshot whose frames hold HOSTILE_FRAMES (in its trace and its segments' blocks), and one
    of its first event alone."""
    trace = [dict(event("alloc", 4096 * i, MiB * (i + 1)), frames=[frame]) for i, frame in enumerate(HOSTILE_FRAMES)]
    blocks = [{"address": 4096 * i, "size": MiB * (i + 1), "requested_size": MiB * (i + 1),
               "state": "active_allocated", "frames": [frame]} for i, frame in enumerate(HOSTILE_FRAMES)]
    segment = {"device": 0, "address": 0, "total_size": 64 * MiB, "stream": 0, "segment_type": "large",
               "blocks": blocks}
    path = write_snapshot({"segments": [segment], "device_traces": [trace]})
    return path, write_snapshot({"segments": [], "device_traces": [trace[:1]]}, "before.pickle")


@pytest.mark.parametrize("command", ["inspect", "diff"])
def test_strings_from_a_snapshot_are_printed_literally(write_snapshot, command: str) -> None:
    """A frame holding [/bold] crashed inspect (rich's MarkupError); exp[v2]/train.py printed as
    exp/train.py; escapes reached the terminal; [link=...] made a hyperlink; a lone surrogate
    crashed diff (a site's name could not cross to C++)."""
    path, before = hostile_snapshot(write_snapshot)
    done = subprocess.run([sys.executable, "-m", "stowage",
                           *(["inspect", str(path)] if command == "inspect" else ["diff", str(before), str(path)])],
                          capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    out = done.stdout.decode("utf-8")  # (strictly: a lone surrogate cannot be in UTF-8)
    for literal in SHOWN:
        assert literal in out, (literal, out)
    assert not [raw for raw in RAW if raw in done.stdout + done.stderr]


def test_the_html_report_shows_every_hostile_string_as_its_escape(write_snapshot, tmp_path: Path) -> None:
    """A lone surrogate in a frame ended stowage inspect --html with a traceback and a 0-byte file;
    ESC and NUL went into the file raw, where a browser or a terminal reading it acts on them."""
    import html

    path, _ = hostile_snapshot(write_snapshot)
    out = tmp_path / "reports" / "report.html"
    out.parent.mkdir()
    done = stowage("inspect", str(path), "--html", str(out))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    data = out.read_bytes()
    page = data.decode("utf-8")
    for literal in SHOWN:
        assert html.escape(literal, quote=True) in page, literal
    assert not [raw for raw in RAW if raw in data]
    assert "<script" not in page and "&lt;/td&gt;&lt;script&gt;" in page
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # nothing left beside it


def test_a_report_that_cannot_be_put_in_place_leaves_the_earlier_one_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stowage.inspection import html as html_report

    out = tmp_path / "report.html"
    out.write_text("the earlier report")

    def refused(source: Any, target: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(html_report.os, "replace", refused)
    with pytest.raises(OSError, match="No space left"):
        html_report.write("<p>a new report</p>", out)
    assert out.read_text() == "the earlier report"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_a_wait_for_copies_answers_ctrl_c_within_a_second() -> None:
    """copy_bandwidth="1KB" was accepted, and mark_step then waited about 35 minutes for the
    offloads, deaf to Ctrl-C. The link's floor is now 10 MB/s, and a wait answers SIGINT."""
    code = textwrap.dedent("""
        import signal, sys, time, torch, stowage
        from stowage.serving import torch_module
        # Python's own Ctrl-C, as a terminal gives it (a shell's background job inherits SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            stowage.enable(device="cpu", capacity="1GiB", copy_bandwidth="1KB")
        except ValueError as error:
            print("refused:", error, flush=True)
        stowage.enable(device="cpu", capacity="1GiB", copy_bandwidth="10MB")
        module = torch_module()
        module.offload_configure(0, 1 << 40)
        packed = module.TensorOffloader(0).pack(torch.ones(100 << 20, dtype=torch.uint8))  # 10 s at 10 MB/s
        print("waiting", flush=True)
        start = time.monotonic()
        try:
            stowage.mark_step()
            print("returned", flush=True)
        except KeyboardInterrupt:
            print("interrupted after", time.monotonic() - start, flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or lines[-1] != "waiting":
            line = child.stdout.readline()
            assert line, child.stderr.read()
            lines.append(line.strip())
        time.sleep(0.5)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        rest = child.stdout.readline().strip()
        answered = time.monotonic() - sent
    finally:
        child.kill()
        child.wait()
    assert any(line.startswith("refused: copy_bandwidth must be from 10 MB/s") for line in lines), lines
    assert rest.startswith("interrupted after"), rest
    assert answered < 1.0, answered


@pytest.mark.skipif(HAS_GPU, reason="the machine has a GPU")
def test_enable_for_a_device_that_is_not_there_refuses_and_installs_nothing() -> None:
    """enable() and STOWAGE_ALLOC_CONF= were accepted without a GPU; memory_stats, memory_summary
    and snapshot then raised TypeErrors, disable() refused, and CPU mode stayed unreachable."""
    code = textwrap.dedent("""
        import torch, stowage
        from stowage.memory import NoCudaDevice
        print("enabled", stowage.is_enabled(), torch.ones(4).sum().item())
        try:
            stowage.enable()
        except NoCudaDevice as error:
            print("refused:", error)
        for call in (stowage.memory_stats, stowage.memory_summary, stowage.snapshot):
            try:
                call()
            except RuntimeError as error:
                print(call.__name__, "not enabled" in str(error))
        stowage.disable()
        stowage.enable(device="cpu", capacity="64MiB")
        print("cpu", stowage.memory_stats()["allocated_bytes.all.current"] >= 0, stowage.is_enabled())
    """)
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "STOWAGE_ALLOC_CONF": ""})
    assert done.returncode == 0, done.stderr
    assert "STOWAGE_ALLOC_CONF is set, but stowage.enable(): this machine has no CUDA device" in done.stderr
    assert "enabled False 4.0" in done.stdout
    assert "refused: stowage.enable(): this machine has no CUDA device" in done.stdout
    assert done.stdout.count(" True") == 3 + 2, done.stdout


@pytest.mark.parametrize("keywords, said", [
    ({"capacity": "1"}, "capacity must be from one page of the simulated device (2 MiB)"),
    ({"capacity": 2**70}, "capacity must be from one page"),
    ({"capacity": 1.5}, "capacity must be an int or a size"),
    ({"capacity": "1GiB", "copy_bandwidth": "1KB"}, "copy_bandwidth must be from 10 MB/s"),
    ({"capacity": "1GiB", "pinned_limit": -1}, "pinned_limit must be from 1 byte"),
    ({"capacity": "1GiB", "conf": {"limit": 1}}, "conf must be a 'key:value,...' string"),
    ({"capacity": "1GiB", "conf": "max_split_size_mb:17592186044416"}, "at most 1073741824 (1 PiB)"),
])
def test_knobs_out_of_their_bounds_are_refused_naming_the_bound(keywords: dict[str, object], said: str) -> None:
    import stowage as package

    conf = keywords.pop("conf", None)
    with pytest.raises((ValueError, TypeError), match=said.replace("(", r"\(").replace(")", r"\)")):
        package.enable(conf, device="cpu", **keywords)  # type: ignore[arg-type]


def test_byte_counts_from_other_modules_are_held_to_their_bounds_too() -> None:
    """host_memory_limit=-1 and min_bytes=2**70 raised internal TypeErrors."""
    import torch

    import stowage as package

    with pytest.raises(ValueError, match="must be from 0 to 2\\*\\*60 bytes, not -1"):
        package.offload.AdamW([torch.nn.Parameter(torch.zeros(4))], host_memory_limit=-1)
    with pytest.raises(ValueError, match="must be from 0 to 2\\*\\*60 bytes"):
        package.offload.activations(min_bytes=2**70)
