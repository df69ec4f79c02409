"""The step context (stowage.step_context): one pair of global module hooks serves every part
of stowage that follows module calls, and observing saved tensors (tagging) leaves torch's
saved-tensor hooks as they were, whatever the order in which regions and recordings begin and
end."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.plan  # noqa: E402
from offload_models import MlpStack  # noqa: E402
from stowage import step_context  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

module_hooks = torch.nn.modules.module


def global_hook_counts() -> tuple[int, int]:
    return len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks)


def test_one_pair_of_module_hooks_serves_recording_offload_and_plans() -> None:
    torch.manual_seed(0)
    model = MlpStack(blocks=2, width=32, hidden=64)
    x = torch.randn(16, 32)
    before = global_hook_counts()
    during: list[tuple[int, int]] = []
    calls: list[int] = []
    unsubscribe = step_context.module_calls.subscribe(lambda call, args: calls.append(len(step_context.module_calls.stack)))
    stowage.record_history(True)
    try:
        trace = stowage.plan.profile(lambda: model(x).sum().backward(), model=model)
        plan = stowage.plan.solve(trace, "1GiB")
        with plan, stowage.offload.activations(min_bytes=0):
            model.register_forward_pre_hook(lambda module, args: during.append(global_hook_counts()))
            model(x).sum().backward()
    finally:
        stowage.record_history(False)
        unsubscribe()
    assert during and all(pre <= before[0] + 1 and post <= before[1] + 1 for pre, post in during)
    assert global_hook_counts() == before
    assert max(calls) == 3 and calls[0] == 1  # the model, a block, its layers: the stack's depth as each began


def test_activation_offload_follows_excluded_modules_from_the_step_context_alone() -> None:
    """exclude= puts no hooks on the excluded modules (the step context's module calls say when
    they run), and what they save stays: excluding every block offloads nothing, excluding none
    offloads."""
    torch.manual_seed(0)
    model = MlpStack(blocks=2, width=32, hidden=64)
    x = torch.randn(16, 32)
    for exclude in ([], list(model.blocks)):
        hooks_during: list[int] = []
        with stowage.offload.activations(min_bytes=0, exclude=exclude) as report:
            hooks_during += [len(b._forward_pre_hooks) + len(b._forward_hooks) for b in model.blocks]
            loss = model(x).sum()
        loss.backward()
        assert hooks_during == [0, 0]
        assert (report.offloaded_bytes > 0) == (not exclude), str(report)


def region_hooks() -> Any:
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)


def top() -> Any:
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


def test_recordings_and_regions_in_any_order_leave_torch_s_hooks_as_they_were() -> None:
    """Random interleavings of recordings started and stopped and regions (the user's, stowage's
    offload) entered and left in nesting order: after each, the innermost open region's hooks
    serve autograd, a recording started outside any region serves it where none is open, and
    once everything has ended torch's hooks and saved_tensors_hooks' methods are torch's own."""
    plain_enter, plain_exit = torch.autograd.graph.saved_tensors_hooks.__enter__, \
        torch.autograd.graph.saved_tensors_hooks.__exit__
    x = torch.randn(4, 4, requires_grad=True)
    for seed in range(20):
        rng = random.Random(seed)
        regions: list[Any] = []  # open, innermost last: (the region, its unpack hook or None for stowage's)
        recording = False
        bottom_expected = False  # a recording started with no region open serves where none is
        for _ in range(30):
            choice = rng.random()
            if choice < 0.25:
                if recording:
                    stowage.record_history(False)
                    recording = bottom_expected = False
                else:
                    with pytest.warns(UserWarning) if regions else _nothing():
                        stowage.record_history(True)
                    recording, bottom_expected = True, not regions
            elif choice < 0.6 or not regions:
                region = region_hooks() if rng.random() < 0.7 else stowage.offload.activations(min_bytes=0)
                region.__enter__()
                regions.append((region, getattr(region, "unpack_hook", None)))
            else:
                region, _ = regions.pop()
                region.__exit__(None, None, None)
            (x * x).sum()  # a save, through whichever hooks serve
            if regions and regions[-1][1] is not None:
                assert top() is not None and top()[1] is regions[-1][1]
            elif not regions:
                assert (top() is not None) == bottom_expected
        while regions:
            regions.pop()[0].__exit__(None, None, None)
        stowage.record_history(False)
        assert top() is None
        assert torch.autograd.graph.saved_tensors_hooks.__enter__ is plain_enter
        assert torch.autograd.graph.saved_tensors_hooks.__exit__ is plain_exit


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *error: Any) -> None:
        return None


def test_a_plan_s_frames_follow_the_modules_inside_a_compiled_block() -> None:
    """Plans and recordings key saves by the innermost module; inside a block compiled on its own
    their hook stops torch.compile's trace there, so the block's modules are followed as in eager."""
    from stowage.plan.module_frames import ModuleFrames

    torch.manual_seed(0)
    model = MlpStack(blocks=2, width=16, hidden=32)
    model.blocks[0] = torch.compile(model.blocks[0], backend="eager")
    entered: list[str] = []
    frames = ModuleFrames(on_enter=lambda frame, args: entered.append(frame.path), root=model)
    frames.install()
    try:
        model(torch.randn(4, 16)).sum().backward()
    finally:
        frames.remove()
    inside = [path for path in entered if path.startswith("blocks.0._orig_mod.")]
    assert inside, entered
