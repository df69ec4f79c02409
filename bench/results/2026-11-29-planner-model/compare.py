"""Records gpt/cnn steps (and a transformers model) and writes their trace documents without timings,
then solves a given trace file at several budgets: run under the old and new package to compare."""
import json, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "tests" / "python"))
import stowage, stowage.plan  # noqa
if not stowage.is_enabled(): stowage.enable(device="cpu", capacity="4GiB")
from test_plan import COST, gpt_step, cnn_step
out = {}
mode = sys.argv[1]
if mode == "record":
    for name, make in (("gpt", gpt_step), ("cnn", cnn_step)):
        model, step = make()
        model.train()
        trace = stowage.plan.profile(step, cost=COST)
        doc = trace.document()
        for op in doc["ops"]:
            op.pop("duration_ms"); op.pop("other_bytes"); op.pop("in_use_bytes")
        for t in doc["tensors"]:
            t.pop("recompute_ms")
        doc.pop("unconstrained_peak_bytes")
        out[name] = doc
        trace.save(f"/tmp/model/{name}-{sys.argv[2]}.json")
    json.dump(out, open(f"/tmp/model/record-{sys.argv[2]}.json", "w"), sort_keys=True)
else:  # solve each given trace file at budgets
    for path in sys.argv[3:]:
        trace = stowage.plan.load_trace(path)
        for share in (0.9, 0.7, 0.5, 0.3, 0.1):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = stowage.plan.solve(trace, int(trace.unconstrained_peak_bytes * share))
            out[f"{path}@{share}"] = [plan.decisions, plan.predicted_peak_bytes, round(plan.predicted_step_ms, 9),
                                      plan.trace.cost.prefetch_depth if hasattr(plan.trace.cost, "prefetch_depth") else plan.trace.cost["prefetch_depth"]]
            plan.save("/tmp/model/p.json")
            again = stowage.plan.load("/tmp/model/p.json")
            assert again.decisions == plan.decisions
    json.dump(out, open(f"/tmp/model/solve-{sys.argv[2]}.json", "w"), sort_keys=True)
