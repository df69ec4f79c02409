"""fit's weighing, old (Python arithmetic, a callback per option: main at e93f17e) or new (one
planner call, stowage._core.weigh_fit), on saved traces and fixed memory figures: every option
printed as JSON on stdout, the weighing's time on stderr. Run with the old package first on
PYTHONPATH (it records each model's traces into TRACES, default /tmp/fit-weighing-traces), then
with the new one (it reads them), and compare the outputs byte for byte:

    PYTHONPATH=OLD python3 compare_weigh.py mlp > old.json; PYTHONPATH=NEW python3 compare_weigh.py mlp > new.json
"""
import hashlib, json, os, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2e"))
TRACES = os.environ.get("TRACES", "/tmp/fit-weighing-traces")
os.makedirs(TRACES, exist_ok=True)
import torch
import stowage
stowage.enable(device="cpu", capacity="4GiB")
torch.set_num_threads(2)
from stowage import _core
from stowage.fitting import accounting, choosing
import stowage.plan
from batch_models import build

NEW = hasattr(choosing, "StepTraces")
COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}
out, timing = [], {}
for name in sys.argv[1:]:
    torch.manual_seed(0)
    model, batches, loss_fn, kind = build(name)
    params = list(model.parameters())
    whole_file, sized_file = f"{TRACES}/{name}-whole.json", f"{TRACES}/{name}-sized.json"
    def step(batch=4):
        loss_fn(model, batches(batch)).backward(); model.zero_grad(set_to_none=True)
    if not os.path.exists(sized_file):
        stowage.plan.profile(lambda: step(4), device="cpu", cost=COST, model=model).save(whole_file)
        stowage.plan.profile(step, sizes={"batch": (2, 3)}, device="cpu", cost=COST, model=model).save(sized_file)
    whole, sized = stowage.plan.load_trace(whole_file), stowage.plan.load_trace(sized_file)
    size = sum(p.numel() * p.element_size() for p in params)
    peak = whole.unconstrained_peak_bytes
    in_use = size + (1 << 20)
    host_cls = _core.FitHost if NEW else accounting.HostMemory
    rates_cls = _core.UpdateRates if NEW else __import__("stowage.fitting.update_rates", fromlist=["x"]).UpdateRates
    rates = rates_cls(3e-6, 4e-7)
    spent = 0.0
    for extra, states, foreach in [(e, k, f) for e in (0.0, 0.1, 0.25, 0.5, 1.2, 4.0) for k in (0.5, 2.5)
                                   for f in (False, True)]:
        capacity = int(in_use + states * size + extra * peak * 4) + (16 << 20)
        for host_room in (size, 8 * size, 64 * size):
            memory = accounting.measure(params, in_use, capacity, 2)
            host = host_cls(16, host_room, "MemAvailable")
            for case in ("whole", "sized", "sized_asked"):
                kw = dict(rows=16 if case != "whole" else 4, smallest=2, can_offload=True, foreach=foreach, reserve=size // 50)
                if case == "whole":
                    kw.update(micro_rows=4)
                elif case == "sized_asked":
                    kw.update(micro_rows=6, micro_count=3)
                else:
                    kw.update(micro_rows=None)
                if NEW:
                    traces = choosing.StepTraces.whole(whole) if case == "whole" else choosing.StepTraces.by_rows(sized, {})
                    begin = time.perf_counter(); options = choosing.weigh(traces, memory, host, rates, **kw)
                else:
                    at = (lambda rows: whole) if case == "whole" else (lambda rows: sized.at({"batch": rows}))
                    begin = time.perf_counter(); options = choosing.weigh(at, memory, host, rates, **kw)
                spent += time.perf_counter() - begin
                rows = []
                for o in options:
                    plan = o.plan
                    rows.append([o.fraction, o.micro_rows, o.micro_batches, o.activation_budget,
                                 repr(o.update_ms), o.host_bytes, o.reason, o.feasible, o.keeps_everything,
                                 repr(o.step_ms) if o.feasible else None,
                                 None if plan is None else hashlib.sha1(",".join(plan.decisions).encode()).hexdigest()[:12],
                                 None if plan is None else plan.predicted_peak_bytes,
                                 None if plan is None else repr(plan.predicted_step_ms),
                                 None if plan is None else (lambda c: c["prefetch_depth"] if isinstance(c, dict) else c.prefetch_depth)(plan.trace.cost)])
                out.append({"model": name, "extra": extra, "states": states, "foreach": foreach, "host": host_room, "case": case,
                            "pick": choosing.pick(choosing.feasible_times(options)), "options": rows})
    timing[name] = spent
print(json.dumps(out, indent=0))
print("TIMING", NEW, stowage.__file__, json.dumps(timing), file=sys.stderr)
