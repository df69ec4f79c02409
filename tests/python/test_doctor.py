"""`stowage doctor` and the hwloc topology behind it (stowage._core.numa_topology)."""

from __future__ import annotations

import copy
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import stowage
from stowage import _core, doctor

NODES = Path("/sys/devices/system/node")
PCI = Path("/sys/bus/pci/devices")
HAS_GPU = Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def cpu_list(text: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}"""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def sys_nodes() -> list[int]:
    """NUMA nodes as Linux lists them; one when the kernel has no NUMA support."""
    if not NODES.is_dir():
        return [0]
    return sorted(int(p.name[4:]) for p in NODES.iterdir() if re.fullmatch(r"node\d+", p.name))


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return doctor.gather()


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"stowage", "cuda", "gpus", "torch", "host_memory", "numa", "advice"}
    assert out["stowage"]["version"] == stowage.__version__
    assert {"build_type", "with_cuda", "with_torch", "cuda_version", "torch_version"} <= set(out["stowage"])
    assert set(out["cuda"]) == {"driver", "runtime"}
    assert isinstance(out["advice"], list) and all(isinstance(line, str) for line in out["advice"])


def test_numa_nodes_match_sys(report: dict[str, Any]) -> None:
    topology = report["numa"]
    assert topology["error"] is None
    assert len(topology["nodes"]) >= 1
    assert [node["os_index"] for node in topology["nodes"]] == sys_nodes()
    assert sum(node["local_memory"] for node in topology["nodes"]) > 0
    # every CPU of the machine belongs to at most one node
    seen: set[int] = set()
    for node in topology["nodes"]:
        cpus = cpu_list(node["cpus"])
        assert not seen & cpus
        seen |= cpus


def test_process_binding_matches_affinity(report: dict[str, Any]) -> None:
    topology = report["numa"]
    assert cpu_list(topology["process_cpus"]) == os.sched_getaffinity(0)
    nodes_of_process = {node["os_index"] for node in topology["nodes"]
                        if cpu_list(node["cpus"]) & os.sched_getaffinity(0)}
    assert set(topology["process_numa_nodes"]) == nodes_of_process


def test_memlock_limit_is_getrlimit(report: dict[str, Any]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    memory = report["host_memory"]
    assert memory["memlock_soft"] == (None if soft == resource.RLIM_INFINITY else soft)
    assert memory["memlock_hard"] == (None if hard == resource.RLIM_INFINITY else hard)
    assert memory["total"] >= memory["available"] > 0


def test_doctor_reports_the_room_the_optimizer_is_held_to(report: dict[str, Any]) -> None:
    # One probe: the room the offloaded optimizer checks is the smallest of what doctor reports.
    memory = report["host_memory"]
    limits = [v for v in (memory["available"], memory["cgroup_room"]) if v is not None]
    room = stowage.offload.host_room()
    slack = 64 << 20  # MemAvailable moves between the two reads
    assert abs(room.available_bytes - min(limits)) <= slack
    assert room.lockable_bytes == memory["memlock_soft"]
    held = stowage.offload.host_room(4096)
    assert (held.available_bytes, held.limited_by) == (4096, "host_memory_limit")


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_without_gpu(report: dict[str, Any]) -> None:
    assert report["gpus"] == []
    assert report["cuda"]["driver"]["device_count"] == 0
    assert report["cuda"]["driver"]["error"]
    assert any("simulated device" in line for line in report["advice"])


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_with_gpu(report: dict[str, Any]) -> None:
    node_indexes = set(sys_nodes())
    assert report["gpus"], report["cuda"]
    for gpu in report["gpus"]:
        assert gpu["total_memory"] > 0
        assert re.fullmatch(r"\d+\.\d+", gpu["compute_capability"])
        assert gpu["numa_nodes"] is None or set(gpu["numa_nodes"]) <= node_indexes
    assert not any("simulated device" in line for line in report["advice"])


def test_torch_state_untouched(report: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    assert report["torch"]["version"] == str(torch.__version__)
    assert report["torch"]["cuda_build"] == torch.version.cuda
    assert not torch.cuda.is_initialized()  # stowage.enable() must still be possible after it


def test_text_report_names_each_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main([]) == 0
    text = capsys.readouterr().out
    for section in doctor.SECTIONS:
        assert re.search(rf"^[\s╭─]*{re.escape(section)}\b", text, re.MULTILINE), section  # a title
    if not HAS_GPU:
        assert "simulated device" in " ".join(text.split())


def test_internal_error_is_reported(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> None:
        raise KeyError("boom")

    monkeypatch.setattr(doctor, "torch_facts", broken)
    assert doctor.main(["--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "stowage doctor: internal error: KeyError" in captured.err


# --- advice, on reports altered from this machine's ------------------------------------------


def with_gpu(report: dict[str, Any], **fields: Any) -> dict[str, Any]:
    altered = copy.deepcopy(report)
    gpu = {"index": 0, "name": "Test GPU", "total_memory": 80 << 30, "pci_bus_id": "0000:3b:00.0",
           "compute_capability": "9.0", "virtual_memory_management": True, "source": "driver",
           "numa_nodes": [0], "near_cpus": "0-1"}
    gpu.update(fields)
    altered["gpus"] = [gpu]
    altered["cuda"]["driver"].update(error=None, device_count=1)
    return altered


def test_advice_no_vmm(report: dict[str, Any]) -> None:
    assert not any("virtual_memory:off" in line for line in doctor.advise(with_gpu(report)))
    advice = doctor.advise(with_gpu(report, virtual_memory_management=False))
    assert any("virtual_memory:off" in line and "GPU 0" in line for line in advice)


def test_advice_gpu_far_from_process(report: dict[str, Any]) -> None:
    altered = with_gpu(report, numa_nodes=[1], near_cpus="8-15")
    altered["numa"].update(process_numa_nodes=[0], process_cpus="0-7", error=None)
    assert any("numactl --cpunodebind=1 --membind=1" in line for line in doctor.advise(altered))
    altered["numa"]["process_numa_nodes"] = [0, 1]
    assert not any("numactl" in line for line in doctor.advise(altered))


def test_advice_memlock(report: dict[str, Any]) -> None:
    altered = copy.deepcopy(report)
    altered["host_memory"].update(memlock_soft=8 << 20, memlock_hard=None)
    advice = [line for line in doctor.advise(altered) if "ulimit -l" in line]
    assert len(advice) == 1 and "ulimit -l unlimited" in advice[0] and "memlock=-1" in advice[0]
    altered["host_memory"].update(memlock_soft=None, memlock_hard=None)
    assert not any("ulimit -l" in line for line in doctor.advise(altered))


def test_advice_torch_without_stowage_allocator(report: dict[str, Any]) -> None:
    if not report["torch"]["installed"] or not report["torch"]["stowage_module"]["importable"]:
        pytest.skip("needs torch and stowage._torch")
    altered = with_gpu(report)
    altered["stowage"]["with_cuda"] = True
    altered["torch"]["cuda_build"] = "13.0"
    altered["torch"]["stowage_module"].update(matches_torch=True, cuda_allocator_built=False)
    assert any("CUDAPluggableAllocator" in line for line in doctor.advise(altered))
    altered["torch"]["stowage_module"]["cuda_allocator_built"] = True
    assert not any("CUDAPluggableAllocator" in line for line in doctor.advise(altered))


def test_advice_driver_older_than_runtime(report: dict[str, Any]) -> None:
    altered = copy.deepcopy(report)
    altered["cuda"]["driver"]["version"] = "12.4"
    altered["cuda"]["runtime"].update(version="13.0", library="libcudart.so.13")
    assert any("update the driver" in line for line in doctor.advise(altered))
    altered["cuda"]["driver"]["version"] = "13.1"
    assert not any("update the driver" in line for line in doctor.advise(altered))


def test_advice_gpus_only_nvidia_smi_sees(report: dict[str, Any]) -> None:
    altered = with_gpu(report, source="nvidia-smi", virtual_memory_management=None)
    altered["cuda"]["driver"].update(error="cuInit failed: CUDA_ERROR_NO_DEVICE", device_count=0)
    advice = doctor.advise(altered)
    assert any("nvidia-smi lists 1 GPU(s)" in line and "CUDA_ERROR_NO_DEVICE" in line for line in advice)
    assert not any("simulated device" in line for line in advice)


# --- the hwloc binding ----------------------------------------------------------------------


def test_pci_device_locality() -> None:
    devices = sorted(PCI.iterdir()) if PCI.is_dir() else []
    if not devices:
        pytest.skip("no PCI devices visible")
    bus_id = devices[0].name  # "0000:00:03.0"
    short = bus_id.split(":", 1)[1]  # "00:03.0": domain 0 implied
    long = "0000" + bus_id.upper()  # CUDA's 8-digit domain, upper-case hex
    topology = _core.numa_topology([bus_id, short, long, "0000:ff:1f.7"])
    first, second, third, absent = topology["pci_devices"]
    assert [first["bus_id"], second["bus_id"], third["bus_id"]] == [bus_id, short, long]
    assert first["found"] and second == {**first, "bus_id": short} and third == {**first, "bus_id": long}
    assert first["vendor_id"] == int((devices[0] / "vendor").read_text(), 16)
    numa_node = int((devices[0] / "numa_node").read_text()) if (devices[0] / "numa_node").exists() else -1
    expected = [numa_node] if numa_node >= 0 else [node["os_index"] for node in topology["nodes"]]
    assert first["numa_nodes"] == expected
    assert absent["found"] is False and absent["numa_nodes"] == []
    assert all(_core.is_pci_bus_id(good) for good in (bus_id, short, long, "0000:ff:1f.7"))


@pytest.mark.parametrize("bad", ["", "3b", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8",
                                 "0000:100:00.0", "x:3b:00.0", "1:2:3:4.0", "0000:3b:00.0 "])
def test_bad_bus_id_raises(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a PCI bus id"):
        _core.numa_topology([bad])
    assert not _core.is_pci_bus_id(bad)  # doctor leaves it out rather than failing the NUMA report


# --- the command ----------------------------------------------------------------------------


def test_module_runs_in_a_fresh_interpreter() -> None:
    result = subprocess.run([sys.executable, "-m", "stowage.doctor", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["numa"]["nodes"]) == len(sys_nodes())


def test_stowage_doctor_command() -> None:
    try:
        from stowage import cli
    except ImportError as error:  # a subcommand module cli names is not there yet
        pytest.skip(f"stowage.cli cannot be imported: {error}")
    if "doctor" not in cli.SUBCOMMANDS:
        pytest.skip("'doctor' is not registered in stowage.cli yet")
    result = subprocess.run([sys.executable, "-m", "stowage", "doctor", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) >= {"stowage", "cuda", "gpus", "torch", "host_memory", "numa", "advice"}
    assert len(out["numa"]["nodes"]) == len(sys_nodes())



def test_a_configuration_torch_loads_with_refused_is_reported_not_a_doctor_failure() -> None:
    """STOWAGE_ALLOC_CONF makes `import torch` fail when stowage cannot use it; doctor is what a
    user runs then, so it reports the refusal, naming the variable, and exits 0."""
    env = {**os.environ, "STOWAGE_ALLOC_CONF": "bogus:1"}
    result = subprocess.run([sys.executable, "-m", "stowage", "doctor", "--json"], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    error = report["torch"]["error"]
    assert "STOWAGE_ALLOC_CONF='bogus:1'" in error and "unknown key 'bogus'" in error, error
    assert any(line.startswith("torch cannot be imported (STOWAGE_ALLOC_CONF='bogus:1'") for line in report["advice"])


def test_a_bus_id_that_is_not_one_leaves_the_numa_report_standing() -> None:
    """nvidia-smi prints "[N/A]" for some GPUs' bus ids."""
    from stowage import doctor

    report = doctor.numa(["[N/A]"])
    assert report["error"] is None
    assert len(report["nodes"]) >= 1
