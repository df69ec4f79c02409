"""How much of the peak the inspector's inferred categories (snapshot/categories.hpp: stacks and
lifetimes, all a stock PyTorch snapshot gives) put where stowage's exact tags (stowage.tagging)
do, on training steps of models the rules were not tuned on.

Each model (bench/e2e/batch_models.py) trains three AdamW steps in CPU mode with history and
tags recorded; the snapshot is read twice: as recorded (exact) and stripped to what torch
records (no ``stowage_tags``: no tags, no module paths). At the trace's peak, the bytes whose
inferred category is the exact one, over the bytes live.

    python3 bench/inspect/categories_accuracy.py [--models mlp,gpt2,...] [--json OUT]

Tuning models (the rules were written against loops like them): mlp, llama, resnet18; the
others are held out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import batch_models  # noqa: E402

import stowage  # noqa: E402
from stowage import _core  # noqa: E402
from stowage.inspection.findings import inspect  # noqa: E402
from stowage.tagging import TAGS_KEY  # noqa: E402

CATEGORIES = _core.category_names

TUNING = ("mlp", "llama", "resnet18")
HELD_OUT = ("gpt2", "hf_llama", "bert", "vit", "convnext", "t5", "opt")
ROWS = {"mlp": 256, "resnet18": 16, "vit": 16, "convnext": 8}


def recorded(name: str, steps: int = 3) -> dict[str, Any]:
    torch.manual_seed(0)
    stowage.record_history(True)
    try:
        model, make_batch, loss_fn, _ = batch_models.build(name)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for step in range(steps):
            loss_fn(model, make_batch(ROWS.get(name, 4))).backward()
            optimizer.step()
            optimizer.zero_grad()
            stowage.mark_step()
        return stowage.snapshot()
    finally:
        stowage.record_history(False)


def compare_at_peak(snapshot: dict[str, Any]) -> dict[str, Any]:
    found, columns = inspect(snapshot, 0, 1)
    assert found.exact_categories, "the recording carries no tags"
    at = found.peak.event_index
    stripped = {key: value for key, value in snapshot.items() if key != TAGS_KEY}  # as torch records it
    exact = inspect(snapshot, 0, 1, moments=[at])[0].moments[0]
    inferred = np.array(inspect(stripped, 0, 1, moments=[at])[0].moments[0].categories, dtype=np.int8)
    truth = np.array(exact.categories, dtype=np.int8)
    size = columns.size[np.array(exact.events, dtype=np.int64)].astype(np.int64)
    by_truth: dict[str, dict[str, int]] = {}
    for c, name in enumerate(CATEGORIES):
        chosen = truth == c
        if chosen.any():
            by_truth[name] = {"bytes": int(size[chosen].sum()), "right": int(size[chosen & (inferred == c)].sum())}
    wrong: dict[str, int] = {}
    for t, i, s in zip(truth.tolist(), inferred.tolist(), size.tolist()):
        if t != i:
            key = f"{CATEGORIES[t]} as {CATEGORIES[i]}"
            wrong[key] = wrong.get(key, 0) + s
    total = int(size.sum())
    right = int(size[truth == inferred].sum())
    return {"peak_bytes": total, "right_bytes": right, "share": right / total if total else 1.0,
            "by_category": by_truth, "wrong": dict(sorted(wrong.items(), key=lambda kv: -kv[1]))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(TUNING + HELD_OUT))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    stowage.enable(device="cpu", capacity="16GiB")
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for name in args.models.split(","):
        started = time.perf_counter()
        found = compare_at_peak(recorded(name))
        found["set"] = "tuning" if name in TUNING else "held out"
        found["seconds"] = round(time.perf_counter() - started, 1)
        results[name] = found
        wrong = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in list(found["wrong"].items())[:3])
        print(f"{name:9s} {found['set']:8s} peak {found['peak_bytes'] / 2**20:8.1f} MiB  right "
              f"{100 * found['share']:5.1f}%  {wrong}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
