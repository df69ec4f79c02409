"""Two installs of stowage timed on the tools' commands, interleaved: wall seconds of the whole
command (interpreter start, loading, analysis, output), medians.

    python3 bench/inspect/commands_old_new.py OLD_STOWAGE NEW_STOWAGE [ROUNDS] [EXTRA_SNAPSHOT]

OLD_STOWAGE and NEW_STOWAGE are `stowage` executables (each venv's bin/stowage); the traces are
/work/shared/traces' (SHARED_TRACES overrides); EXTRA_SNAPSHOT adds `stowage inspect --json` of it.
Each round runs every command with both, their order alternating from round to round.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    old, new = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    traces = Path(os.environ.get("SHARED_TRACES", "/work/shared/traces"))
    deepseek, transformer = traces / "gpu_deepseek1.3b_finetune_step.pickle", traces / "gpu_transformer2.7b_ctx128_fullstep.pickle"
    html = Path(tempfile.mkdtemp()) / "report.html"
    commands = {
        f"inspect --json {deepseek.name}": ["inspect", "--json", str(deepseek)],
        f"inspect {deepseek.name}": ["inspect", str(deepseek)],
        f"inspect --html OUT {transformer.name}": ["inspect", "--html", str(html), str(transformer)],
        f"diff --json {deepseek.name} {transformer.name}": ["diff", "--json", str(deepseek), str(transformer)],
        f"diff {deepseek.name} {transformer.name}": ["diff", str(deepseek), str(transformer)],
        "replay --json cpu_resnet50_b16_3steps.pickle": ["replay", "--json", str(traces / "cpu_resnet50_b16_3steps.pickle")],
        "replay cpu_resnet50_b16_3steps.pickle": ["replay", str(traces / "cpu_resnet50_b16_3steps.pickle")],
        "doctor --json": ["doctor", "--json"],
        "doctor": ["doctor"],
    }
    if len(sys.argv) > 4:
        commands[f"inspect --json {Path(sys.argv[4]).name}"] = ["inspect", "--json", sys.argv[4]]
    seconds: dict[tuple[str, str], list[float]] = {(c, v): [] for c in commands for v in (old, new)}
    for round_ in range(rounds):
        for name, args in commands.items():
            for executable in (old, new) if round_ % 2 == 0 else (new, old):
                start = time.perf_counter()
                subprocess.run([executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                seconds[(name, executable)].append(time.perf_counter() - start)
    print(f"load average after: {os.getloadavg()}")
    print("| command | old (s, median) | new (s, median) |\n|---|---|---|")
    for name in commands:
        print(f"| stowage {name} | {statistics.median(seconds[(name, old)]):.2f} | "
              f"{statistics.median(seconds[(name, new)]):.2f} |")


if __name__ == "__main__":
    main()
