"""Batch-size finders that recognise an out-of-memory error by its text work with stowage: a
Hugging Face Trainer with auto_find_batch_size=True, in CPU mode, settles on the batch that a
search by hand finds fits on the same simulated device."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

# Activations of about 0.75 MiB an example on a 74 MiB device: batch 77 fits (about 70 MiB at its
# peak), 86 and 96 do not (77 MiB and more).
SCRIPT = """
    import gc, json, tempfile
    import torch, stowage
    stowage.enable(device="cpu", capacity="74MiB")
    from torch import nn
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging
    logging.set_verbosity_error()

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(16, 65536), nn.GELU(), nn.Linear(65536, 16))

        def forward(self, x, labels):
            return {"loss": nn.functional.mse_loss(self.net(x), labels)}

    generator = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(16, generator=generator), "labels": torch.randn(16, generator=generator)}
            for _ in range(128)]
    tried = []

    class NoteBatch(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            tried.append(state.train_batch_size)

    def train(batch, auto):
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, auto_find_batch_size=auto,
                                     max_steps=1, use_cpu=True, report_to=[], save_strategy="no",
                                     logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0)
            trainer = Trainer(model=Wide(), args=args, train_dataset=data, callbacks=[NoteBatch()])
            trainer.remove_callback(PrinterCallback)
            try:
                trainer.train()
                return trainer.state.train_batch_size
            finally:
                del trainer
                gc.collect()

    found = train(96, auto=True)
    auto_tried = list(tried)
    # By hand, in the same CPU mode, with the reduction accelerate's find_executable_batch_size
    # makes (accelerate 1.x: 0.9 times the batch; earlier releases halved it).
    batch, hand_tried = 96, []
    while True:
        hand_tried.append(batch)
        try:
            train(batch, auto=False)
            break
        except torch.OutOfMemoryError:
            batch = int(batch * 0.9)
    print(json.dumps({"auto": found, "auto_tried": auto_tried, "hand": batch, "hand_tried": hand_tried}))
"""


def test_the_trainers_auto_find_batch_size_settles_on_the_batch_that_fits() -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["hand_tried"] == [96, 86, 77], "the device's size no longer separates the batches"
    assert found["auto_tried"] == found["hand_tried"], "the Trainer caught stowage's OOM and tried smaller batches"
    assert found["auto"] == found["hand"] == 77
