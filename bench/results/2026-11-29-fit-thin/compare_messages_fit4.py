# fit's refusal texts, batch layouts and asked cuts for a set of inputs, through whichever build is imported
# (bench/results/2026-11-29-fit-thin.md, fourth wave): run once with each build, diff the outputs.
import sys, types, torch
from stowage.fitting import recording, fitted, batches
from stowage.plan.sizes import StepsDiffer
from stowage._core import MicroCut
out = []
fails = [("batch {2, 3}", RuntimeError("shape mismatch\nsecond line")), ("batch {2, 3} x seq {4, 5, 6}", ValueError(""))]
for full in ({"batch": 8}, {"batch": 8, "seq": 512}):
    for f in (fails, fails + [("x", StepsDiffer("ops differ"))] if isinstance(StepsDiffer("a"), Exception) else fails):
        try:
            if hasattr(recording, "_cut_fails"):
                out.append(str(recording._cut_fails(full, f)))
            else:
                from stowage import _core
                out.append(_core.unrecordable_message(list(full.items()), [(g, recording._first_line(e)) for g, e in f],
                                                      any(isinstance(e, StepsDiffer) for _, e in f)))
        except Exception as e:
            out.append("ERR " + repr(e))
# _too_large: gradients of a small model, in_use patched
model = torch.nn.Linear(10, 20)
recording.stowage_memory.memory_allocated = lambda device: 123456789
if hasattr(recording, "_too_large"):
    out.append(str(recording._too_large(model, torch.device("cpu"), 8 << 30, {"batch": 2, "seq": 64}, "OutOfMemoryError: x")))
else:
    from stowage import _core
    out.append(_core.too_large_message([("batch", 2), ("seq", 64)], 123456789, 8 << 30, 10 * 20 * 4 + 20 * 4, "OutOfMemoryError: x"))
# fitted's out of memory and the rows guard
for units in (None, batches.ROWS):
    for batch in (None, torch.zeros(3, 7, dtype=torch.long), torch.zeros(16, 9, dtype=torch.long),
                  torch.zeros(4, 600, dtype=torch.long), {"a": 1}, torch.zeros(8, 512, dtype=torch.long)):
        self = types.SimpleNamespace(example=types.SimpleNamespace(layout=batches.BatchLayout.of(torch.zeros(8, 512, dtype=torch.long))),
                                     units=units, cut=MicroCut(8, 2, 4), plan=types.SimpleNamespace(departed_steps=5))
        try:
            out.append(fitted.Fitted._out_of_memory(self, RuntimeError("CUDA out of memory"), batch))
        except Exception as e:
            out.append("ERR " + repr(e))
for bad in (torch.zeros(4, 3), (torch.zeros(4, 2), torch.zeros(5)), (torch.zeros(1, 3), torch.ones(1, 5, dtype=torch.long)),
            {"x": torch.zeros(6, 3, 8), "ids": torch.zeros(6, 11, dtype=torch.long), "pos": torch.zeros(1, 11, dtype=torch.long),
             "s": torch.tensor(1.0), "m": torch.zeros(6, 11, dtype=torch.bool)}, {"n": 3}, [torch.tensor(2.0)],
            tuple(torch.zeros(i + 2, 1) for i in range(8)), torch.zeros(0, 3)):
    try:
        l = batches.BatchLayout.of(bad); out.append(repr(l))
    except Exception as e:
        out.append("ERR " + type(e).__name__ + str(e))
for mb in ("auto", 1, 2, 3, 4, 0, -1, True, 2.0, "two"):
    for rows in (0, 1, 3, 4, 8, 13):
        try:
            e = batches.ExampleBatch.of(torch.zeros(rows, 2), mb); out.append(f"{mb} {rows} {e.cut and (e.cut.rows, e.cut.count, e.cut.most)}")
        except Exception as e:
            out.append(f"{mb} {rows} ERR {type(e).__name__} {e}")
print("\n=====\n".join(out))
