"""Snapshots stowage records carry what each allocation is and which module made it
(stowage.tagging): the inspector's categories are then exact, to the byte, and it names modules;
the saved-tensor hook refuses a backward that builds a graph rather than change its gradients;
a malformed ``stowage_tags`` is an error naming its field."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.inspection.findings import inspect, inspect_device, report_of  # noqa: E402
from stowage.snapshot_reader import SnapshotError  # noqa: E402
from stowage.tagging import CreateGraphRefused  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def mlp() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
                                 for _ in range(4)), torch.nn.Linear(256, 4))


def recorded(run: Any, **options: Any) -> dict[str, Any]:
    stowage.record_history(True, **options)
    try:
        run()
        return stowage.snapshot()
    finally:
        stowage.record_history(False)


def train(model: Any, rows: Any, steps: int = 3, hooks: Any = None) -> Any:
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        with hooks() if hooks is not None else torch.enable_grad():
            model(rows).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        stowage.mark_step()
    return optimizer


def test_the_categories_at_the_peak_are_exact_and_modules_are_named() -> None:
    made: dict[str, Any] = {}

    def run() -> None:
        made["model"] = model = mlp()
        made["rows"] = torch.randn(512, 256)
        made["optimizer"] = train(model, made["rows"])

    report = inspect_device(recorded(run), 0, 20)
    peak, model = report["peak"], made["model"]
    assert report["category_source"].startswith("exact")
    found = peak["categories"]
    assert found["parameters"] == sum(p.numel() * 4 for p in model.parameters())
    assert found["inputs"] == made["rows"].numel() * 4
    states = sum(v.untyped_storage().nbytes() for s in made["optimizer"].state.values() for v in s.values())
    assert found["optimizer states"] == states
    # the peak is at the start of backward: each hidden Linear's and GELU's outputs are saved
    assert found["activations"] >= 8 * 512 * 256 * 4
    modules = {row["module"]: row["bytes"] for row in peak["modules"]}
    assert modules["Sequential.0.0"] >= 512 * 256 * 4 + 257 * 256 * 4  # its output, its weight and bias
    assert "Sequential.3.1" in modules


def test_the_tags_survive_the_file_and_a_user_s_own_saved_tensor_hooks(tmp_path: Any) -> None:
    packed: list[int] = []

    def hooks() -> Any:
        return torch.autograd.graph.saved_tensors_hooks(lambda t: (packed.append(1), t)[1], lambda t: t)

    snapshot = recorded(lambda: train(mlp(), torch.randn(512, 256), hooks=hooks))
    assert packed  # the region's own hook still served autograd
    path = tmp_path / "tagged.pickle"
    import pickle

    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    from stowage.snapshot_reader import load_snapshot_columnar

    report = inspect_device(load_snapshot_columnar(path), 0, 5)
    assert report["peak"] == inspect_device(snapshot, 0, 5)["peak"]
    assert report["peak"]["categories"]["activations"] >= 8 * 512 * 256 * 4


def test_a_backward_that_builds_a_graph_is_refused_and_records_without_tags() -> None:
    def penalty() -> Any:
        torch.manual_seed(0)
        x = torch.randn(64, 16, requires_grad=True)
        layer = torch.nn.Linear(16, 16)
        y = torch.tanh(layer(x)).sum()
        (grad,) = torch.autograd.grad(y, x, create_graph=True)
        return grad.square().sum()

    expected = penalty()
    with pytest.raises(CreateGraphRefused, match="tags=False"):
        recorded(penalty)
    got: list[Any] = []
    recorded(lambda: got.append(penalty()), tags=False)
    assert torch.equal(got[0], expected)


@pytest.mark.parametrize("field, value, message", [
    ("events", [10**9], "stowage_tags.0.events[0]: expected an integer"),
    ("category", ["x"], "stowage_tags.0.category[0]"),
    ("modules", [], "stowage_tags.0.modules: expected a non-empty list"),
    ("categories", ["weights"], "stowage_tags.0.categories"),
])
def test_malformed_tags_are_an_error_naming_the_field(field: str, value: Any, message: str) -> None:
    snapshot = recorded(lambda: train(mlp(), torch.randn(64, 256), steps=1))
    tags = snapshot["stowage_tags"]["0"]
    tags[field] = value
    if field in ("events", "category"):
        keep = len(value)
        for other in ("events", "category", "module"):
            tags[other] = tags[other][:keep] if other != field else value
    with pytest.raises(SnapshotError, match=message.replace("[", r"\[").replace("]", r"\]")):
        inspect_device(snapshot, 0, 5)


def test_an_event_that_is_not_an_allocation_is_refused() -> None:
    snapshot = recorded(lambda: train(mlp(), torch.randn(64, 256), steps=1))
    trace = snapshot["device_traces"][0]
    tags = snapshot["stowage_tags"]["0"]
    tags["events"][0] = next(i for i, event in enumerate(trace) if event["action"] != "alloc")
    with pytest.raises(SnapshotError, match="is not an allocation"):
        inspect_device(snapshot, 0, 5)


def test_the_html_report_draws_memory_by_category_and_by_block() -> None:
    from stowage.inspection.html import render

    snapshot = recorded(lambda: train(mlp(), torch.randn(512, 256)))
    found, trace = inspect(snapshot, 0, 5, timelines=True)
    html = render("tagged", report_of(snapshot, 0, found, trace), snapshot, found)
    by_category = html.index("Live memory by what it is (exact")
    by_module = html.index("Live memory by the module that made it")
    assert html.index("<h2>Advice</h2>") < by_category < by_module < html.index("Live memory by allocation site")
    legend = html[by_module:html.index("<svg", by_module)]
    assert all(f"Sequential.{k}" in legend for k in range(5))  # each block of the model apart


def test_modules_added_and_models_made_again_are_followed() -> None:
    def run() -> None:
        for _ in range(2):  # a model made again (ids reused), a module added after its first forward
            net = mlp()
            net(torch.randn(8, 256)).sum().backward()
            net.append(torch.nn.Linear(4, 4))
            net(torch.randn(8, 256)).sum().backward()

    tags = recorded(run)["stowage_tags"]["0"]
    assert "Sequential.5" in tags["modules"]


class KeywordModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(256, 256)

    def forward(self, input_ids: Any = None) -> Any:
        return self.layer(input_ids).square().mean()


def test_inputs_given_by_keyword_are_inputs() -> None:
    made: dict[str, Any] = {}

    def run() -> None:
        net = KeywordModel()
        made["batch"] = torch.randn(1024, 256)
        net(input_ids=made["batch"]).backward()

    snapshot = recorded(run)
    assert inspect_device(snapshot, 0, 5)["peak"]["categories"].get("inputs") == made["batch"].numel() * 4


def no_default_hooks() -> bool:
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_recording_started_or_stopped_inside_a_region_with_hooks_of_its_own_leaves_torch_s_as_it_was() -> None:
    with pytest.warns(UserWarning, match="started inside a saved_tensors_hooks region"):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            stowage.record_history(True)
    stowage.record_history(False)  # outside the region it was started in
    assert no_default_hooks()
    stowage.record_history(True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        stowage.record_history(False)  # inside a region entered while recording
        assert not no_default_hooks()
    assert no_default_hooks()  # the region left, the recording's hooks went with it
    x = torch.randn(4, 4, requires_grad=True)
    y = x.exp()
    y.add_(1)  # autograd's own check of a saved tensor changed in place is back
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    snapshot = recorded(lambda: train(mlp(), torch.randn(64, 256), steps=1))  # and recording again works
    assert snapshot["stowage_tags"]["0"]["events"]


def test_an_event_index_past_any_integer_is_an_error_naming_it() -> None:
    snapshot = recorded(lambda: train(mlp(), torch.randn(64, 256), steps=1))
    tags = snapshot["stowage_tags"]["0"]
    tags["events"] = [2**70] + tags["events"][1:]
    with pytest.raises(SnapshotError, match=r"stowage_tags\.0\.events\[0\]: expected an integer"):
        inspect_device(snapshot, 0, 5)
