"""The inspector's advice on stock PyTorch's own CUDA snapshots (an H200, torch 2.11; recorded by
bench/inspect/cuda_advice_record.py): for GPT-2, Llama, BERT, ResNet-50 and ViT-B/16, loops that
waste memory (logits at the peak, evaluation without no_grad, gradients kept across steps, a
loss kept with its graph every step), each run again on the GPU with the waste fixed. Every rule
whose fix was measured predicts the saving within 15%; the rules fire where the waste is."""

from __future__ import annotations

import gzip
import json
import pickle
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench" / "inspect"))
import cuda_advice_check  # noqa: E402

RECORDED = REPO / "bench" / "traces" / "h200-advice"
PEAKS = json.loads((RECORDED / "advice_peaks.json").read_text())
SNAPSHOTS = pickle.loads(gzip.decompress((RECORDED / "advice_snapshots.pickle.gz").read_bytes()))
EXPECTED = {"eval_with_grad": "forward without backward", "kept_outputs": "memory growing every step"}


@pytest.mark.parametrize("key", sorted(PEAKS["runs"]))
def test_the_advice_saves_what_it_says_on_a_gpu(key: str) -> None:
    rows = cuda_advice_check.compared(SNAPSHOTS[key], PEAKS["runs"][key])
    loop = key.split("/")[1]
    if loop in EXPECTED:
        assert EXPECTED[loop] in {row["rule"] for row in rows}
    for row in rows:
        if "measured_bytes" in row:
            assert abs(row["predicted_bytes"] - row["measured_bytes"]) <= 0.15 * row["measured_bytes"], row
