"""The offloaded optimizer's host kernel (offload/adamw_kernel.cpp) bit for bit torch's on this
CPU (Note [torch's roundings]), on random states over several steps: every option, sizes that
are no multiple of the vector width, one thread and several, and extreme values (zeros,
denormals, infinities, NaN, the largest floats, a huge eps).

fp32 parameters (with their output in fp32, bf16 or fp16: master_weights) against torch's
default AdamW / Adam on a CPU, the single-tensor path; parameters kept in their own precision
against torch's fused AdamW / Adam, the path whose roundings they follow. NaN is compared by
position: torch and the kernel reach it by different operations, so its payload may differ."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stowage import _torch as stowage_torch  # noqa: E402

STEPS = 3
# no multiple of 16 (an AVX-512 vector of floats) but the first; the last ones split over threads
SIZES = [64, 1, 15, 17, 33, 2047, 2049, 4099, 140_001]
EXTREMES = [0.0, -0.0, 1e-40, -1e-40, 1e-45, 1.2e-38, 3.0e38, -3.0e38, math.inf, -math.inf, math.nan, 1e-20, 1e20]


def _random_tensor(n: int, scale: float, generator: Any, extreme_share: float, rng: random.Random) -> Any:
    values = torch.randn(n, generator=generator) * scale
    count = int(n * extreme_share)
    if count:
        where = torch.tensor(rng.sample(range(n), count))
        values[where] = torch.tensor([rng.choice(EXTREMES) for _ in range(count)])
    return values


def _same_bits(ours: Any, theirs: Any, what: str, skip: Any = None) -> None:
    assert ours.dtype == theirs.dtype, what
    if skip is not None:
        ours, theirs = ours[~skip], theirs[~skip]
    nan = ours.isnan()
    assert torch.equal(nan, theirs.isnan()), f"{what}: NaN at other places"
    int_type = torch.int32 if ours.element_size() == 4 else torch.int16
    a, b = ours[~nan].view(int_type), theirs[~nan].view(int_type)
    differ = (a != b).nonzero()
    if differ.numel():
        first = int(differ[0])
        raise AssertionError(f"{what}: {differ.numel()} of {ours.numel()} differ, the first "
                             f"{float(ours[~nan][first])} against torch's {float(theirs[~nan][first])}")


def _hyper(rng: random.Random, extreme: bool) -> dict[str, Any]:
    return dict(lr=rng.choice([1e-3, 3e-4, 0.5]),
                betas=(rng.choice([0.9, 0.3, 0.0, 0.5]), rng.choice([0.999, 0.95, 0.5])),
                eps=rng.choice([1e-8, 1e10, 0.0, 1e-30]) if extreme else rng.choice([1e-8, 1e-6]),
                weight_decay=rng.choice([0.0, 0.1, 1e30 if extreme else 0.01]))


def _torch_optimizer(params: list[Any], decoupled: bool, hyper: dict[str, Any], **options: Any) -> Any:
    return (torch.optim.AdamW if decoupled else torch.optim.Adam)(params, **hyper, **options)


def _states(optimizer: Any, p: Any, m: Any, v: Any, v_max: Any | None) -> None:
    """Starts torch's optimizer from the given moments (as a loaded state_dict would)."""
    optimizer.state[p] = {"step": torch.tensor(0.0), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    if v_max is not None:
        optimizer.state[p]["max_exp_avg_sq"] = v_max.clone()


OPTIONS = [(decoupled, amsgrad, maximize, extreme) for decoupled in (True, False) for amsgrad in (False, True)
           for maximize in (False, True) for extreme in (False, True)]
# every option at one size past a vector and a chunk; the others at the rest of the sizes
CASES = [(4099, *options) for options in OPTIONS] + [
    (size, *OPTIONS[(7 * i + 3) % len(OPTIONS)]) for i, size in enumerate(SIZES) if size != 4099] + [
    (size, *OPTIONS[(5 * i + 6) % len(OPTIONS)]) for i, size in enumerate(SIZES) if size != 4099]


@pytest.mark.parametrize("size,decoupled,amsgrad,maximize,extreme", CASES)
def test_fp32_masters_are_bit_for_bit_torch_s_single_tensor_adam(size: int, decoupled: bool, amsgrad: bool,
                                                                 maximize: bool, extreme: bool) -> None:
    if not stowage_torch.adamw_takes_torch_sqrt():
        pytest.skip("torch here has no MKL: its CPU sqrt is the correctly rounded one, as the kernel's default")
    rng = random.Random(f"{size}-{decoupled}-{amsgrad}-{maximize}-{extreme}")
    generator = torch.Generator().manual_seed(rng.randrange(1 << 30))
    share = 0.05 if extreme else 0.0
    hyper = _hyper(rng, extreme)
    master = _random_tensor(size, 1.0, generator, share, rng)
    m = _random_tensor(size, 1e-2, generator, share, rng)
    v = _random_tensor(size, 1e-4, generator, share, rng).abs()
    v_max = (v * 1.5 if amsgrad else None)
    reference = torch.nn.Parameter(master.clone())
    optimizer = _torch_optimizer([reference], decoupled, hyper, amsgrad=amsgrad, maximize=maximize, foreach=False)
    _states(optimizer, reference, m, v, v_max)
    out_type = rng.choice([torch.float32, torch.bfloat16, torch.float16])
    out = torch.empty(size, dtype=out_type)
    threads = rng.choice([1, 2, 3])
    grad_scale = rng.choice([1.0, 1.0 / 1024, 0.37])
    for step in range(1, STEPS + 1):
        grad = _random_tensor(size, 1e-2, generator, share, rng)
        reference.grad = grad * grad_scale if grad_scale != 1.0 else grad.clone()
        optimizer.step()
        stowage_torch.adamw_update(master, m, v, grad, out, step, hyper["lr"], *hyper["betas"], hyper["eps"],
                                   hyper["weight_decay"], grad_scale, threads, decoupled_weight_decay=decoupled,
                                   maximize=maximize, max_exp_avg_sq=v_max, cpu_sqrt=True)
        state = optimizer.state[reference]
        _same_bits(master, reference.detach(), f"master after step {step}")
        _same_bits(m, state["exp_avg"], f"exp_avg after step {step}")
        _same_bits(v, state["exp_avg_sq"], f"exp_avg_sq after step {step}")
        if amsgrad:
            _same_bits(v_max, state["max_exp_avg_sq"], f"max_exp_avg_sq after step {step}")
        _same_bits(out, reference.detach().to(out_type), f"the {out_type} output after step {step}")


NARROW_CASES = [(dtype, 4099, *options) for dtype in (torch.bfloat16, torch.float16) for options in OPTIONS] + [
    (dtype, size, *OPTIONS[(3 * i + j) % len(OPTIONS)]) for j, dtype in enumerate((torch.bfloat16, torch.float16))
    for i, size in enumerate((1, 17, 2049, 140_001))]


@pytest.mark.parametrize("dtype,size,decoupled,amsgrad,maximize,extreme", NARROW_CASES)
def test_states_in_the_parameters_precision_are_bit_for_bit_torch_s_fused_adam(
        dtype: Any, size: int, decoupled: bool, amsgrad: bool, maximize: bool, extreme: bool) -> None:
    rng = random.Random(f"{dtype}-{size}-{decoupled}-{amsgrad}-{maximize}-{extreme}")
    generator = torch.Generator().manual_seed(rng.randrange(1 << 30))
    share = 0.05 if extreme else 0.0
    hyper = _hyper(rng, extreme)
    param = _random_tensor(size, 1.0, generator, share, rng).to(dtype)
    m = _random_tensor(size, 1e-2, generator, share, rng).to(dtype)
    v = _random_tensor(size, 1e-4, generator, share, rng).abs().to(dtype)
    v_max = (v * 1.5 if amsgrad else None)
    reference = torch.nn.Parameter(param.clone())
    optimizer = _torch_optimizer([reference], decoupled, hyper, amsgrad=amsgrad, maximize=maximize, fused=True)
    _states(optimizer, reference, m, v, v_max)
    threads = rng.choice([1, 2, 3])
    # torch's fused kernel takes amsgrad's maximum with std::max on the elements past its last
    # whole vector, which keeps the old maximum where the new moment is NaN; its vectors (and its
    # single-tensor path, and the kernel) take NaN. Those elements are left out.
    nan_moment = torch.zeros(size, dtype=torch.bool)
    for step in range(1, STEPS + 1):
        grad = _random_tensor(size, 1e-2, generator, share, rng).to(dtype)
        reference.grad = grad.clone()
        optimizer.step()
        stowage_torch.adam_update_narrow(param, m, v, grad, step, hyper["lr"], *hyper["betas"], hyper["eps"],
                                         hyper["weight_decay"], 1.0, threads, decoupled_weight_decay=decoupled,
                                         maximize=maximize, max_exp_avg_sq=v_max)
        state = optimizer.state[reference]
        _same_bits(m, state["exp_avg"], f"exp_avg after step {step}")
        _same_bits(v, state["exp_avg_sq"], f"exp_avg_sq after step {step}")
        if amsgrad:
            nan_moment |= v.isnan()
            _same_bits(v_max, state["max_exp_avg_sq"], f"max_exp_avg_sq after step {step}", skip=nan_moment)
        _same_bits(param, reference.detach(), f"parameter after step {step}", skip=nan_moment)
