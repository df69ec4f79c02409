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
    return _core.nvidia_smi_gpus(done.stdout), None


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
    except (ImportError, ValueError) as error:  # (ValueError: STOWAGE_ALLOC_CONF refused as torch loads)
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


def numa(bus_ids: list[str]) -> dict[str, Any]:
    """hwloc's view: NUMA nodes, this process's CPUs, and each bus id's nearest nodes. A bus id
    that is not one (nvidia-smi prints "[N/A]" for some) is left out rather than failing all."""
    try:
        return dict(_core.numa_topology([b for b in bus_ids if _core.is_pci_bus_id(b)]), error=None)
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


# One line per thing on this machine that limits stowage, stated as fact plus remedy
# (device/machine_advice.hpp), over gather()'s report.
advise = _core.machine_advice


def print_report(report: dict[str, Any], console: Console) -> None:
    for title, columns, rows in _core.machine_report_tables(report):  # (device/machine_report.hpp)
        table = Table(title=title, show_header=bool(columns), title_justify="left", title_style="bold")
        if not columns:  # (fact, value) rows
            table.add_column("fact", style="cyan", no_wrap=True)
            table.add_column("value")
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*map(literal, row))  # driver, library and error texts from the system
        console.print(table)
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
