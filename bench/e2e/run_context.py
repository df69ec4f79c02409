"""What the end-to-end benchmarks share: the machine and version record of a run, percentiles,
choosing torch's CUDA allocator (native or stowage) before CUDA starts, and running one
allocator's measurement in a fresh interpreter."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """The GPU, software versions and date of this run."""
    import torch

    properties = torch.cuda.get_device_properties(0)
    info: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_gib": round(properties.total_memory / GiB, 2),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
    }
    try:
        import stowage

        info["stowage"] = stowage.__version__
    except ImportError:
        info["stowage"] = None
    return info


def install_allocator(allocator: str, conf: str) -> None:
    """Makes ``allocator`` torch's CUDA allocator; must run before anything initialises CUDA."""
    import torch

    if torch.cuda.is_initialized():
        raise SystemExit("CUDA was initialised before the allocator was chosen")
    if allocator == "native":
        if os.environ.get("STOWAGE_ALLOC_CONF") is not None:
            raise SystemExit("--allocator native: unset STOWAGE_ALLOC_CONF, which installs stowage at import torch")
        return
    import stowage

    if stowage.is_enabled():  # STOWAGE_ALLOC_CONF installed it at import torch
        if conf:
            raise SystemExit("--conf and STOWAGE_ALLOC_CONF both given: use one")
        return
    stowage.enable(conf or None, device="cuda")


def spawn(script: Path, allocator: str, forwarded: list[str], conf: str) -> dict[str, Any]:
    """Runs ``script`` for one allocator in a fresh interpreter and returns its JSON result."""
    environment = dict(os.environ)
    environment.pop("STOWAGE_ALLOC_CONF", None)
    with tempfile.TemporaryDirectory() as directory:
        output = Path(directory) / f"{allocator}.json"
        command = [sys.executable, str(script), "--allocator", allocator, "--json", str(output), *forwarded]
        if allocator == "stowage" and conf:
            command += ["--conf", conf]
        completed = subprocess.run(command, env=environment)
        if not output.exists():
            return {"allocator": allocator, "error": f"exit status {completed.returncode}, no result"}
        return json.loads(output.read_text())
