"""How each system in peers_at_budget.py trains one decoder: each `prepare_*` builds the model its
own way (where its parameters start matters to what fits), sets up its optimizer and returns the
training step, one call a step, returning the loss. Every system trains the same Qwen2 model
(transformers' Qwen2ForCausalLM, fp32 parameters), with AdamW, bf16 autocast on a GPU (fp32 on a
CPU) and transformers' own loss (logits of the whole vocabulary), and all but stowage.fit with
every decoder layer checkpointed (fit plans its own recomputation). FSDP2 and DeepSpeed compute
in bf16 their own ways instead of autocast (FSDP2's MixedPrecisionPolicy; DeepSpeed's bf16 mode:
bf16 parameters, fp32 masters with the optimizer on the host): each system at its best setting.

A system that cannot run here raises Unavailable with the reason, which becomes its row's."""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from transformers import Qwen2ForCausalLM

import stowage

from decoder_ladder import DecoderShape

LEARNING_RATE = 1e-5
Step = Callable[[], float]


class Unavailable(Exception):
    """This system cannot run on this machine (a missing package, no GPU): its row says why."""


@dataclass
class Trial:
    shape: DecoderShape
    device: str  # "cuda" or "cpu"
    batch: int
    seq: int
    budget_bytes: int | None  # the device cap, None for the whole device

    def config(self) -> Any:
        return self.shape.config(self.seq)

    def tokens(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, self.shape.vocab, (self.batch, self.seq), generator=generator).to(self.device)

    def autocast(self) -> Any:
        if self.device == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()


def causal_lm_loss(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss


def build_on(trial: Trial, device: str, dtype: torch.dtype = torch.float32) -> Any:
    """The model made on `device` in `dtype` (never in host fp32 first on a GPU), in training mode."""
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(trial.config())
    finally:
        torch.set_default_dtype(default)
    model.train()
    return model


def checkpoint_layers(model: Any) -> None:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def plain_step(trial: Trial, model: Any, optimizer: Any, autocast: bool = True) -> Step:
    tokens = trial.tokens()
    precision = trial.autocast if autocast else contextlib.nullcontext

    def step() -> float:
        with precision():
            loss = causal_lm_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def prepare_stock(trial: Trial) -> Step:
    """Stock PyTorch with every layer checkpointed and torch's AdamW (fused on a GPU: its leanest)."""
    model = build_on(trial, trial.device)
    checkpoint_layers(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=trial.device == "cuda")
    return plain_step(trial, model, optimizer)


def torchao_offload(offload_gradients: bool) -> Callable[[Trial], Step]:
    def prepare(trial: Trial) -> Step:
        """torchao's CPUOffloadOptimizer (states and the update on the host, torch's fused CPU
        AdamW), every layer checkpointed; `offload_gradients` moves each gradient to the host as
        backward makes it."""
        if trial.device != "cuda":
            raise Unavailable("torchao's CPUOffloadOptimizer needs CUDA: not run in CPU mode")
        try:
            from torchao.optim import CPUOffloadOptimizer
        except ImportError:
            try:
                from torchao.prototype.low_bit_optim import CPUOffloadOptimizer
            except ImportError as error:
                raise Unavailable(f"torchao is not installed ({error}); tools/fetch-gpu-deps carries its wheel")
        model = build_on(trial, trial.device)
        checkpoint_layers(model)
        optimizer = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, offload_gradients=offload_gradients,
                                        fused=True, lr=LEARNING_RATE)
        return plain_step(trial, model, optimizer)

    return prepare


def start_single_process_group(backend: str) -> None:
    """A world of one, met through a file on this machine (no network)."""
    if dist.is_initialized():
        return
    rendezvous = tempfile.NamedTemporaryFile(prefix="peers-rendezvous-", delete=False)
    rendezvous.close()
    os.unlink(rendezvous.name)
    dist.init_process_group(backend, init_method=f"file://{rendezvous.name}", rank=0, world_size=1)


def materialise(model: Any, trial: Trial, parameter_device: str, buffer_device: str) -> None:
    """A model built on the meta device, given memory and values: parameters on
    `parameter_device` (normal, std 0.02; norms' weights one), the rotary frequencies recomputed
    on `buffer_device`."""
    model.to_empty(device=parameter_device)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            local = parameter.to_local() if hasattr(parameter, "to_local") else parameter  # a DTensor's shard
            if name.endswith("norm.weight"):
                local.fill_(1.0)
            else:
                local.normal_(0.0, 0.02)
    rotary = model.model.rotary_emb
    fresh = type(rotary)(config=trial.config())
    rotary.register_buffer("inv_freq", fresh.inv_freq.to(buffer_device), persistent=False)
    if hasattr(rotary, "original_inv_freq"):
        rotary.register_buffer("original_inv_freq", fresh.inv_freq.to(buffer_device).clone(), persistent=False)
    others = [name for name, _ in model.named_buffers() if not name.endswith(("inv_freq", "original_inv_freq"))]
    if others:
        raise RuntimeError(f"buffers the meta build does not recompute: {others}")


def prepare_fsdp2(trial: Trial) -> Step:
    """FSDP2 on one process (world size 1): every decoder layer and the root a unit, parameters on
    the host under CPUOffloadPolicy (each unit's brought in before it runs, gradients sent back),
    torch's AdamW on the host; every layer checkpointed. bf16 compute by its MixedPrecisionPolicy
    (bf16 parameters gathered, fp32 gradients reduced), FSDP's own way and its leanest: autocast
    would keep a bf16 copy of every gathered parameter until the forward ends. In CPU mode: no
    offload policy (the parameters are on the CPU already), fp32, gloo."""
    start_single_process_group("nccl" if trial.device == "cuda" else "gloo")
    if trial.device == "cuda":
        torch.cuda.set_device(0)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(trial.config())
    model.train()
    checkpoint_layers(model)
    on_gpu = trial.device == "cuda"
    options = dict(mesh=init_device_mesh(trial.device, (1,)),
                   offload_policy=CPUOffloadPolicy() if on_gpu else OffloadPolicy(),
                   mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32) if on_gpu else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    materialise(model, trial, "cpu", trial.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    return plain_step(trial, model, optimizer, autocast=False)


def deepspeed_offload(stage: int) -> Callable[[Trial], Step]:
    def prepare(trial: Trial) -> Step:
        """DeepSpeed ZeRO (stage 2: the optimizer on the host, ZeRO-Offload; stage 3: the
        parameters too, ZeRO-Infinity's CPU form), bf16 mode, DeepSpeedCPUAdam (JIT-built once by
        ninja, cached in TORCH_EXTENSIONS_DIR), every layer checkpointed."""
        if trial.device != "cuda":
            raise Unavailable("DeepSpeed's offload needs CUDA: not run in CPU mode")
        try:
            import deepspeed
        except ImportError as error:
            raise Unavailable(f"deepspeed is not installed ({error}); tools/fetch-gpu-deps carries its wheel")
        # A world of one already met (start_single_process_group); the variables DeepSpeed reads
        # besides, so that it looks for no launcher (MPI) to find them
        for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", "29517")):
            os.environ.setdefault(name, value)
        start_single_process_group("nccl")
        torch.cuda.set_device(0)
        config = deepspeed_config(trial, stage)
        if stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=config, remote_device="cpu", pin_memory=True):
                model = build_on(trial, "cpu", torch.bfloat16)
        else:
            model = build_on(trial, trial.device, torch.bfloat16)
        checkpoint_layers(model)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        tokens = trial.tokens()

        def step() -> float:
            loss = causal_lm_loss(engine, tokens)
            engine.backward(loss)
            engine.step()
            return float(loss.detach())

        return step

    return prepare


def deepspeed_config(trial: Trial, stage: int) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                            "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": 50_000_000, "allgather_bucket_size": 50_000_000}
    if stage == 3:
        zero.update(offload_param={"device": "cpu", "pin_memory": True}, stage3_prefetch_bucket_size=50_000_000,
                    stage3_param_persistence_threshold=100_000, stage3_max_live_parameters=1_000_000_000)
    return {"train_micro_batch_size_per_gpu": trial.batch, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True}, "zero_optimization": zero, "steps_per_print": 1 << 30,
            "optimizer": {"type": "AdamW", "params": {"lr": LEARNING_RATE, "weight_decay": 0.01}},
            "wall_clock_breakdown": False}


def stowage_fit(parameters_off_device: bool) -> Callable[[Trial], Step]:
    def prepare(trial: Trial) -> Step:
        """stowage.fit under the budget (`budget=`; the allocator's limit is set before CUDA starts,
        peers_probe.choose_allocator): states, plan and whatever else fit chooses. The
        parameters-off-the-device row asks fit for that mode and is skipped where this build has
        no stowage.offload.parameters."""
        options: dict[str, Any] = {}
        if parameters_off_device:
            if not hasattr(stowage.offload, "parameters"):
                raise Unavailable("this build has no stowage.offload.parameters (parameters off the device): "
                                  "the stowage-fit row is what fit chooses without it")
            if "offload_parameters" not in inspect.signature(stowage.fit).parameters:
                raise Unavailable("stowage.fit takes no offload_parameters= in this build: the stowage-fit row is "
                                  "what fit chooses")
            options["offload_parameters"] = True
        model = build_on(trial, trial.device)
        tokens = trial.tokens()

        def loss_fn(m: Any, batch: torch.Tensor) -> torch.Tensor:
            with trial.autocast():
                return causal_lm_loss(m, batch)

        fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=LEARNING_RATE), tokens,
                             loss_fn=loss_fn, budget=trial.budget_bytes, verbose=bool(os.environ.get("FIT_VERBOSE")),
                             **options)
        return lambda: float(fitted.step(tokens))

    return prepare


SYSTEMS: dict[str, Callable[[Trial], Step]] = {
    "torch+checkpoint": prepare_stock,
    "torchao-offload": torchao_offload(offload_gradients=False),
    "torchao-offload+gradients": torchao_offload(offload_gradients=True),
    "fsdp2-cpu-offload": prepare_fsdp2,
    "deepspeed-zero2-offload": deepspeed_offload(stage=2),
    "deepspeed-zero3-offload": deepspeed_offload(stage=3),
    "stowage-fit": stowage_fit(parameters_off_device=False),
    "stowage-fit+parameters": stowage_fit(parameters_off_device=True),
}
