"""``stowage doctor``: this machine as it concerns stowage (how this copy was built, the CUDA driver
and runtime, the GPUs, torch, host memory and its locked-memory limit, NUMA), with advice where
something limits it. A report, not a check: the exit status is 0 whatever it finds, non-zero only
when the doctor itself fails; ``--json`` prints the same as one JSON object.

The driver and the runtime are asked by the device layer's probes (dlopen, no CUDA context), so
torch's CUDA state is never initialised: stowage.enable() still works in the same process
afterwards. A GPU's NUMA node is found through its PCI bus id, since Debian's hwloc has no CUDA
plugin.
"""
from __future__ import annotations

import argparse
import csv
import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from stowage import _core
from stowage.serving import is_cpu_allocator, is_cuda_allocator
from stowage.terminal import console, literal


SECTIONS = ("stowage", "CUDA", "GPUs", "torch", "host memory", "NUMA", "advice")


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name,
        help="report the machine as it concerns stowage (CUDA, GPUs, torch, pinned memory, NUMA)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(parser)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


# --- CUDA, through the device layer's probes (device/cuda_driver_probe.hpp) ---------


def nvidia_smi_gpus() -> tuple[list[dict[str, Any]], str | None]:
    """The GPUs nvidia-smi lists (in PCI order, ignoring CUDA_VISIBLE_DEVICES), and an error."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return [], None
    query = "index,name,memory.total,pci.bus_id,compute_cap"
    try:
        done = subprocess.run([program, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [], f"nvidia-smi: {error}"
    if done.returncode != 0:
        return [], f"nvidia-smi: {(done.stdout + done.stderr).strip() or f'exit status {done.returncode}'}"
    gpus = []
    for row in csv.reader(done.stdout.splitlines(), skipinitialspace=True):
        if len(row) != 5:
            continue
        index, name, memory, bus_id, capability = row
        gpus.append({
            "index": int(index) if index.isdigit() else len(gpus),
            "name": name,
            "total_memory": int(memory) << 20 if memory.isdigit() else None,
            "pci_bus_id": bus_id,
            "compute_capability": capability if re.fullmatch(r"\d+\.\d+", capability) else None,
            "virtual_memory_management": None,
            "source": "nvidia-smi",
        })
    return gpus, None


def _runtime_candidates() -> list[str]:
    """libcudart in the order a stowage process would use it: loaded already (by torch), the
    one torch's wheels bring (site-packages/nvidia/*/lib), then the system's."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    found = [path for path in re.findall(r"(/\S+)$", maps, flags=re.MULTILINE)
             if Path(path).name.startswith("libcudart.so")][:1]
    for entry in sys.path:
        found.extend(sorted(str(p) for p in Path(entry or ".").glob("nvidia/*/lib/libcudart.so.*")))
    found.append("libcudart.so")
    if (system := ctypes.util.find_library("cudart")) is not None:
        found.append(system)
    return found


# --- torch and stowage ----------------------------------------------------------------------


def torch_facts() -> dict[str, Any]:
    """torch's version and CUDA build, and stowage's torch module: what it was built for and
    whether stowage is the allocator now. Never initialises torch's CUDA state."""
    facts: dict[str, Any] = {
        "installed": False, "version": None, "cuda_build": None, "cuda_device_count": None,
        "cuda_initialized": None, "error": None, "stowage_module": None,
        "environment": {key: os.environ[key] for key in
                        ("STOWAGE_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
                        if key in os.environ},
    }
    try:
        import torch  # here: stowage doctor reports a machine without torch, or a broken one
    except ImportError as error:
        facts["error"] = str(error)
        return facts
    facts.update(installed=True, version=str(torch.__version__), cuda_build=torch.version.cuda)
    if torch.version.cuda is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "found no NVIDIA driver": the CUDA section says so
            facts["cuda_device_count"] = int(torch.cuda.device_count())
        facts["cuda_initialized"] = bool(torch.cuda.is_initialized())
    facts["stowage_module"] = _stowage_torch(str(torch.__version__))
    return facts


def _stowage_torch(torch_version: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"importable": False, "error": None, "built_for_torch": None,
                             "matches_torch": None, "cuda_allocator_built": False,
                             "cuda_torch_versions": [], "cuda_allocator_enabled": False,
                             "cpu_allocator_enabled": False}
    try:
        from stowage import _torch  # as torch: it may be missing or broken, which doctor reports
    except ImportError as error:
        facts["error"] = str(error)
        return facts
    versions = [v for v in re.split(r"[;, ]+", str(_torch.cuda_torch_versions)) if v]
    facts.update(importable=True, built_for_torch=str(_torch.built_for_torch),
                 matches_torch=_torch.built_for_torch == torch_version,
                 cuda_allocator_built=bool(_torch.has_cuda), cuda_torch_versions=versions)
    if facts["matches_torch"]:  # a module built for another torch is not to be called into
        facts["cuda_allocator_enabled"] = is_cuda_allocator(_torch)
        facts["cpu_allocator_enabled"] = is_cpu_allocator(_torch)
    return facts


# --- host memory and NUMA -------------------------------------------------------------------


_BUS_ID = re.compile(r"^([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def numa(bus_ids: list[str]) -> dict[str, Any]:
    """hwloc's view: NUMA nodes, this process's CPUs, and each bus id's nearest nodes. A bus id
    that is not one (nvidia-smi prints "[N/A]" for some) is left out rather than failing all."""
    try:
        return dict(_core.numa_topology([b for b in bus_ids if _BUS_ID.match(b)]), error=None)
    except (RuntimeError, ValueError) as error:
        return {"error": f"hwloc: {error}", "nodes": [], "pci_devices": [], "process_cpus": None,
                "process_numa_nodes": [], "hwloc_api_version": None, "packages": None,
                "cores": None, "processing_units": None}


# --- the report -----------------------------------------------------------------------------


def gather() -> dict[str, Any]:
    """Every fact the report shows, and the advice drawn from them, as one JSON-ready dict."""
    build = dict(_core.build_info())
    torch = torch_facts()  # first: then the runtime found is the one torch loaded
    driver, gpus = _core.cuda_driver()  # (the driver, libcuda.so.1, and its GPUs; an "error" says why none)
    if not gpus:
        gpus, smi_error = nvidia_smi_gpus()
        if smi_error:
            driver["nvidia_smi_error"] = smi_error
    runtime = _core.cuda_runtime(_runtime_candidates())
    topology = numa([gpu["pci_bus_id"] for gpu in gpus if gpu["pci_bus_id"]])
    located = {device["bus_id"]: device for device in topology["pci_devices"]}
    for gpu in gpus:
        device = located.get(gpu["pci_bus_id"])
        gpu["numa_nodes"] = device["numa_nodes"] if device and device["found"] else None
        gpu["near_cpus"] = device["cpus"] if device and device["found"] else None
    report = {
        "stowage": build,
        "cuda": {"driver": driver, "runtime": runtime},
        "gpus": gpus,
        "torch": torch,
        "host_memory": _core.host_memory(),  # (the probe the offloaded optimizer sizes by)
        "numa": topology,
    }
    report["advice"] = advise(report)
    return report


def _bytes(value: int | None) -> str:
    return "unlimited" if value is None else _core.format_bytes(value)


# One line per thing on this machine that limits stowage, stated as fact plus remedy
# (device/machine_advice.hpp), over gather()'s report.
advise = _core.machine_advice


def _facts_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left", title_style="bold")
    table.add_column("fact", style="cyan", no_wrap=True)
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, literal(str(value)))  # driver, library and error texts from the system
    return table


def _yes(value: bool | None) -> str:
    return "unknown" if value is None else "yes" if value else "no"


def _nodes(indexes: list[int]) -> str:
    return ",".join(map(str, indexes))


def _stowage_rows(build: dict[str, Any], module: dict[str, Any]) -> list[tuple[str, str]]:
    versions = ", ".join(module.get("cuda_torch_versions") or [])
    allocator = "not built"
    if module.get("cuda_allocator_built"):
        allocator = f"built for torch {versions}" if versions else "built"
    sanitizer = f", sanitizer {build['sanitizer']}" if build["sanitizer"] else ""
    return [
        ("version", build["version"]),
        ("build type", build["build_type"] + sanitizer),
        ("compiler", build["compiler"]),
        ("CUDA backend", f"built (CUDA {build['cuda_version']})" if build["with_cuda"] else "not built"),
        ("torch integration",
         f"built for torch {build['torch_version']}" if build["with_torch"] else "not built"),
        ("torch CUDA allocator", allocator),
    ]


def _cuda_rows(driver: dict[str, Any], runtime: dict[str, Any]) -> list[tuple[str, str]]:
    driver_devices = str(driver["device_count"])
    if driver["version"] and driver["error"]:
        driver_devices += f" ({driver['error']})"
    return [
        ("driver", f"CUDA {driver['version']} ({driver['library']})" if driver["version"]
         else driver["error"] or "unknown"),
        ("driver devices", driver_devices),
        ("runtime", f"CUDA {runtime['version']} ({runtime['library']})" if runtime["version"]
         else runtime["error"] or "unknown"),
        ("runtime devices", str(runtime["device_count"]) if runtime["device_count"] is not None
         else f"none ({runtime['error']})"),
    ]


def _print_gpus(gpus: list[dict[str, Any]], driver: dict[str, Any], console: Console) -> None:
    if not gpus:
        console.print(_facts_table("GPUs", [("none", driver["error"] or "the driver reports no GPU")]))
        return
    table = Table(title="GPUs", title_justify="left", title_style="bold")
    for column in ("#", "name", "memory", "PCI bus id", "compute capability", "VMM", "NUMA node"):
        table.add_column(column)
    for gpu in gpus:
        table.add_row(str(gpu["index"]), literal(gpu["name"] or "?"),
                      "?" if gpu["total_memory"] is None else _bytes(gpu["total_memory"]),
                      gpu["pci_bus_id"] or "?", gpu["compute_capability"] or "?",
                      _yes(gpu["virtual_memory_management"]),
                      "unknown" if gpu["numa_nodes"] is None else _nodes(gpu["numa_nodes"]))
    console.print(table)


def _torch_rows(torch: dict[str, Any]) -> list[tuple[str, str]]:
    if not torch["installed"]:
        return [("installed", f"no ({torch['error']})")]
    module = torch["stowage_module"]
    if module["importable"]:
        built = f"built for torch {module['built_for_torch']}"
        built += "" if module["matches_torch"] else " (not this torch)"
    else:
        built = f"cannot be imported: {module['error']}"
    count = torch["cuda_device_count"]
    rows = [
        ("version", torch["version"]),
        ("CUDA build", torch["cuda_build"] or "none (CPU-only build)"),
        ("GPUs torch sees", "-" if count is None else str(count)),
        ("stowage._torch", built),
        ("stowage is the CUDA allocator", _yes(module["cuda_allocator_enabled"])),
        ("stowage is the CPU allocator", _yes(module["cpu_allocator_enabled"])),
    ]
    return rows + [(key, repr(value)) for key, value in torch["environment"].items()]


def _memory_rows(memory: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        ("physical", _bytes(memory["total"])),
        ("available", "unknown" if memory["available"] is None else _bytes(memory["available"])),
        ("cgroup's room", "no limit" if memory["cgroup_room"] is None else _bytes(memory["cgroup_room"])),
        ("locked-memory limit (ulimit -l)",
         f"{_bytes(memory['memlock_soft'])} (hard: {_bytes(memory['memlock_hard'])})"),
    ]


def _print_numa(topology: dict[str, Any], console: Console) -> None:
    if topology["error"]:
        console.print(_facts_table("NUMA", [("hwloc", topology["error"])]))
        return
    console.print(_facts_table("NUMA", [
        ("hwloc", topology["hwloc_api_version"]),
        ("machine", f"{topology['packages']} package(s), {topology['cores']} cores, "
                    f"{topology['processing_units']} hardware threads, "
                    f"{len(topology['nodes'])} NUMA node(s)"),
        ("this process", f"CPUs {topology['process_cpus']}, NUMA node "
                         f"{_nodes(topology['process_numa_nodes'])}"),
    ]))
    nodes = Table(title="NUMA nodes", title_justify="left", title_style="bold")
    for column in ("node", "memory", "CPUs", "allowed"):
        nodes.add_column(column)
    for node in topology["nodes"]:
        nodes.add_row(str(node["os_index"]), _bytes(node["local_memory"]), node["cpus"],
                      _yes(node["allowed"]))
    console.print(nodes)


def print_report(report: dict[str, Any], console: Console) -> None:
    driver, runtime = report["cuda"]["driver"], report["cuda"]["runtime"]
    console.print(_facts_table("stowage", _stowage_rows(report["stowage"],
                                                        report["torch"]["stowage_module"] or {})))
    console.print(_facts_table("CUDA", _cuda_rows(driver, runtime)))
    _print_gpus(report["gpus"], driver, console)
    console.print(_facts_table("torch", _torch_rows(report["torch"])))
    console.print(_facts_table("host memory", _memory_rows(report["host_memory"])))
    _print_numa(report["numa"], console)
    text = "\n".join(f"- {literal(line)}" for line in report["advice"]) or "Nothing here limits stowage."
    console.print(Panel(text, title="advice", title_align="left"))


def run(args: argparse.Namespace) -> int:
    try:
        report = gather()
    except Exception as error:  # a bug in the doctor itself: say so, never a traceback
        print(f"stowage doctor: internal error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    out = console()
    print_report(report, out if out.is_terminal else console(width=120))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stowage.doctor``: the same as ``stowage doctor``."""
    parser = argparse.ArgumentParser(prog="stowage doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
