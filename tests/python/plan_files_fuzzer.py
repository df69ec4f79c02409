"""Seeded random mutations of the planner's files (a lifetime trace, a sized trace, a plan),
each read as a user would (``stowage plan`` in process, ``stowage.plan.load``), under a memory
cap: every case must end in a result or a refusal that names the file (an InputError, exit 2),
within the bounds of stowage.validation (time and memory), and never in a traceback.

    python tests/python/plan_files_fuzzer.py KIND SEED CASES [--memory-mib N]

KIND is profile (a lifetime trace), sized or plan. Prints one JSON object: the outcomes counted, the slowest case,
the process's peak resident memory, and each failure (its mutation and traceback). The test
suite runs it (tests/python/test_plan_files_fuzz.py); longer runs: more CASES.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HOSTILE_VALUES: list[Any] = [
    None, True, False, -1, 0, 1, 2, 3, 2**31, 2**53, 2**62, 2**64, 10**30, -(2**62), 1e30, -1e30, 1e-300, 0.5,
    "", "x" * 5000, "\x1b]0;title\x07\x1b[2J", "[/bold]", "[link=http://example.com]x[/link]", "exp[v2]/train.py",
    [], {}, [0, 0, 0], [[], []], {"a": 1}, ["blocks.0", 0, 0], "forward", "backward", "recompute", "offload",
]
TEXT_INSERTS = ["[" * 40, "{" * 40, "NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, '"\\ud800"', ",", ":", "]", "}",
                "null", '{"format": "stowage-plan"}', "\x00", "\xff"]


# --- valid documents ---


def small_profile(blocks: int = 3, per: int = 4, scale: int = 1) -> dict[str, Any]:
    """A valid lifetime trace: `blocks` checkpoint regions of `per` forward ops, each saving one
    tensor used again in backward; byte counts proportional to `scale` (a batch size)."""
    ops, tensors, regions = [], [], []
    forward = blocks * per
    for b in range(blocks):
        regions.append({"module": f"blocks.{b}", "call": 0, "checkpointable": True,
                        "ops": ["aten.addmm.default"] * per, "inputs": [b * per] if b else []})
        for k in range(per):
            ops.append({"name": "aten.addmm.default", "module": f"blocks.{b}.fc{k}", "phase": "forward",
                        "duration_ms": 0.4, "other_bytes": 4096, "region": b, "region_op": k,
                        "io_bytes": 3 * 65536 * scale, "in_use_bytes": 65536 * scale * (len(ops) + 1)})
    for i in range(forward):
        ops.append({"name": "aten.mm.default", "module": "", "phase": "backward", "duration_ms": 0.8,
                    "other_bytes": 0, "region": -1, "region_op": -1, "io_bytes": 65536 * scale,
                    "in_use_bytes": 65536 * scale * (forward - i)})
    for i in range(forward):
        b, k = divmod(i, per)
        tensors.append({"module": f"blocks.{b}.fc{k}", "bytes": 65536 * scale, "created": i, "last_forward_use": i,
                        "first_backward_use": len(ops) - 1 - i, "last_backward_use": len(ops) - 1 - i,
                        "recompute_ms": 0.4, "recomputable": True, "offloadable": True,
                        "recompute_inputs": [b * per] if k and b else [], "region": b,
                        "packs": [[f"blocks.{b}.fc{k}", 0, 0]]})
    return {"format": "stowage-lifetimes", "version": 1, "ops": ops, "tensors": tensors, "regions": regions,
            "cost": {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2},
            "unconstrained_peak_bytes": 65536 * scale * forward, "kept_saves": [["tokens", 0, 0]]}


def small_sized() -> dict[str, Any]:
    return {"format": "stowage-sized-lifetimes", "version": 1, "sizes": {"batch": [2, 4]},
            "profiles": [small_profile(scale=2), small_profile(scale=4)]}


def small_plan() -> dict[str, Any]:
    import stowage.plan
    from stowage.plan.file_formats import load_trace_document

    profile = load_trace_document(small_profile(), "<corpus>")
    plan = stowage.plan.solve(profile, profile.unconstrained_peak_bytes // 2)
    return {"format": "stowage-plan", "version": 1, "budget": plan.budget, "decisions": [d.name for d in plan.decisions],
            "profile": profile.document()}


# --- mutations ---


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a document (the root excluded)."""
    found = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        found.append((*path, key))
        found += _places(child, (*path, key))
    return found


def _parent(document: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        document = document[key]
    return document


def mutate_document(text: str, places: list[tuple[Any, ...]], rng: random.Random) -> str:
    """One to three changes to the document `text` holds (`places`: its paths); returns the
    changed document's text. A change whose place an earlier one removed is skipped."""
    document = json.loads(text)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(places)
        try:
            parent = _parent(document, path)
            key = path[-1]
            if not isinstance(parent, (dict, list)):
                continue
            current = parent[key]
        except (KeyError, IndexError, TypeError):
            continue
        kind = rng.random()
        if kind < 0.55:
            parent[key] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
        elif kind < 0.65:
            del parent[key]
        elif kind < 0.72 and isinstance(parent, dict):
            parent[rng.choice(["extra", "\x1b[31m", "ops2"])] = rng.choice(HOSTILE_VALUES)
        elif kind < 0.82 and isinstance(current, list) and current:
            choice = rng.random()
            if choice < 0.4:
                current.append(copy.deepcopy(rng.choice(current)))
            elif choice < 0.7:
                current.pop(rng.randrange(len(current)))
            else:
                rng.shuffle(current)
        elif kind < 0.92 and isinstance(current, int) and not isinstance(current, bool):
            parent[key] = current + rng.choice([-2, -1, 1, 2, 1000])
        else:  # another part of the document in its place
            other = rng.choice(places)
            try:
                parent[key] = copy.deepcopy(_parent(document, other)[other[-1]])
            except (KeyError, IndexError, TypeError):
                continue
    return json.dumps(document)


def mutate_text(text: str, rng: random.Random) -> str:
    """One to three byte-level changes to a document's text."""
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(chars) + 1)
        kind = rng.random()
        if kind < 0.3 and chars:
            chars[min(at, len(chars) - 1)] = chr(rng.randrange(32, 127))
        elif kind < 0.5:
            del chars[at:at + rng.randint(1, 20)]
        elif kind < 0.8:
            chars[at:at] = rng.choice(TEXT_INSERTS)
        else:
            cut = rng.randrange(len(chars) + 1)
            chars = chars[:cut]
    return "".join(chars)


# --- readers, as a user meets them ---


_PARSERS: list[argparse.ArgumentParser] = []


def run_command(*argv: str) -> int:
    """``stowage plan ARGV`` in this process; its exit status (output discarded)."""
    from stowage.plan import command

    if not _PARSERS:
        parser = argparse.ArgumentParser()
        command.add_parser(parser.add_subparsers(dest="command"), "plan")
        _PARSERS.append(parser)
    args = _PARSERS[0].parse_args(["plan", *argv])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        status = command.run(args)
    if status == 2:
        assert err.getvalue().startswith("stowage plan: "), err.getvalue()
    return status


def read_profile(path: Path) -> str:
    status = run_command(str(path), "--budget", "50%")
    return {0: "fits", 1: "no plan fits", 2: "refused"}[status]


def read_sized(path: Path) -> str:
    status = run_command(str(path), "--budget", "50%", "--at", "batch=8")
    return {0: "fits", 1: "no plan fits", 2: "refused"}[status]


def read_plan(path: Path) -> str:
    import stowage.plan
    from stowage.validation import InputError

    try:
        plan = stowage.plan.load(path)
    except InputError as error:
        assert str(error).startswith(str(path)), str(error)
        return "refused"
    assert plan.predicted_peak_bytes >= 0
    return "loaded"


KINDS: dict[str, tuple[Callable[[], Any], Callable[[Path], str]]] = {
    "profile": (small_profile, read_profile), "sized": (small_sized, read_sized), "plan": (small_plan, read_plan)}


def fuzz(kind: str, seed: int, cases: int) -> dict[str, Any]:
    make, read = KINDS[kind]
    rng = random.Random(seed)
    original = make()
    original_text = json.dumps(original)
    places = _places(original)
    seen: dict[str, int] = {}
    failures: list[dict[str, str]] = []
    slowest = 0.0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{kind}.json"
        for case in range(cases):
            text = mutate_text(original_text, rng) if rng.random() < 0.3 else mutate_document(original_text, places, rng)
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
            start = time.perf_counter()
            try:
                outcome = read(path)
            except BaseException:  # noqa: BLE001 (any escape is the failure counted)
                outcome = "traceback"
                if len(failures) < 5:
                    failures.append({"case": str(case), "text": text[:400], "traceback": traceback.format_exc()})
            slowest = max(slowest, time.perf_counter() - start)
            seen[outcome] = seen.get(outcome, 0) + 1
    return {"kind": kind, "seed": seed, "cases": cases, "outcomes": seen, "slowest_s": slowest,
            "peak_rss_mib": peak_resident() / (1 << 20), "failures": failures}


def peak_resident() -> int:
    """This process's peak resident memory in bytes: VmHWM (ru_maxrss keeps the parent's across
    fork and exec, so a run started by a large test process would report that one's)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("seed", type=int)
    parser.add_argument("cases", type=int)
    parser.add_argument("--memory-mib", type=int, default=1024, help="the address-space cap of the run")
    args = parser.parse_args()
    cap = args.memory_mib << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    print(json.dumps(fuzz(args.kind, args.seed, args.cases)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
