"""Snapshots stowage records carry what each allocation is and which module made it
(stowage.tagging): the inspector's categories are then exact, to the byte, and it names modules;
the saved-tensor hook refuses a backward that builds a graph rather than change its gradients;
a malformed ``stowage_tags`` is an error naming its field."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.inspector import inspect_device  # noqa: E402
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
    from stowage.html_report import render

    snapshot = recorded(lambda: train(mlp(), torch.randn(512, 256)))
    html = render("tagged", inspect_device(snapshot, 0, 5), snapshot)
    by_category = html.index("Live memory by what it is (exact")
    by_module = html.index("Live memory by the module that made it")
    assert html.index("<h2>Advice</h2>") < by_category < by_module < html.index("Live memory by allocation site")
    legend = html[by_module:html.index("<svg", by_module)]
    assert all(f"Sequential.{k}" in legend for k in range(5))  # each block of the model apart
