"""The inspector's categories on stock PyTorch's own CUDA snapshots (an H200, torch 2.11; recorded
by bench/inspect/cuda_categories_record.py): GPT-2, Llama, BERT, ResNet-50 and ViT-B/16 training
with AdamW, each checked at two moments of its third step against what the recording knew
(parameters, gradients, optimizer states, saved activations, the batch). On a GPU the backward
runs on autograd's thread, whose allocations and frees torch records with no frames at all."""

from __future__ import annotations

import gzip
import json
import pickle
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench" / "inspect"))
import cuda_categories_check  # noqa: E402

RECORDED = REPO / "bench" / "traces" / "h200-categories"
TRUTH = json.loads((RECORDED / "truth.json").read_text())


@pytest.mark.parametrize("model", sorted(TRUTH["models"]))
def test_nine_in_ten_live_bytes_are_put_in_their_category(model: str) -> None:
    truth = TRUTH["models"][model]
    snapshot = pickle.loads(gzip.decompress((RECORDED / f"{model}.pickle.gz").read_bytes()))
    markers = {name: value["size"] for name, value in truth.items() if isinstance(value, dict)}
    inferred = cuda_categories_check.categorised_at_markers(snapshot, markers)
    for marker in markers:
        found = cuda_categories_check.compare(inferred[marker], truth[marker]["known"])
        assert found["share"] >= 0.9, (marker, found["largest_wrong"])
    # After the forward most of what is live is the saved activations; after backward, none is.
    forward = cuda_categories_check.compare(inferred["after_forward"], truth["after_forward"]["known"])
    assert forward["by_truth"]["activations"]["right"] >= 0.9 * forward["by_truth"]["activations"]["bytes"]
    assert "activations" not in {category for category, _ in inferred["after_backward"].values()}
