"""stowage.fit's predicted step against the step it then runs: for models stowage did not write
(transformers' GPT-2 and Llama at small configurations, torchvision's ResNet-18, peft's LoRA on
that Llama) and a GPT-2-shaped decoder of our own (bench/e2e/gpt2_model.py), at the options fit
takes at a few budgets:

  device  no budget: the whole share of AdamW's states on the device (torch's own AdamW)
  share   a budget below the whole share's need (the gradients, half the states and the unplanned
          activations beside what is in use): a smaller share, a plan that recomputes or
          offloads, whichever fit predicts faster
  host    offload_parameters=True: the blocks' parameters on the host

Per (model, option), in a fresh process: fit (verbose off), then --warmup steps and --steps timed
ones through fitted.backward() and fitted.optimizer.step(). Prints, per row, fit's predicted step,
update and forward+backward (the plan's step and the parameters' copies) beside the measured
medians and min-max of the steps, and the error. --json writes every figure.

    python bench/e2e/fit_prediction.py --device cpu --json OUT.json
    python bench/e2e/fit_prediction.py --device cuda --models gpt --options device share \
        --layers 24 --width 2048 --rows 2 --seq 2048 --budget 24GiB     # a GPU stage
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
MODELS = ("gpt", "hf_gpt2", "hf_llama", "resnet18", "llama_lora")
OPTIONS = ("device", "share", "host")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--capacity", default="8GiB", help="CPU mode's simulated device")
    parser.add_argument("--budget", default=None, help="fit's budget for the device option (default: none)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--options", nargs="+", choices=OPTIONS, default=list(OPTIONS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's threads in each row's process (default: torch's); on a busy host 1 keeps a "
                        "step's ops from waiting for a second core")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1, help="each row run this many times, interleaved")
    parser.add_argument("--before", help="another build's package directory, put first on the path: each row "
                        "runs with it and with the installed build, in turns")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "OPTION"), help=argparse.SUPPRESS)
    return parser.parse_args()


def build(args: argparse.Namespace, name: str, device: Any) -> tuple[Any, Any, Callable[[Any, Any], Any]]:
    """A model from seed 0 on `device`, its batch and its loss function."""
    import torch

    torch.manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.rows, args.seq), device=device)
    if name == "gpt":
        sys.path.insert(0, str(HERE))
        from gpt2_model import GPT, GPTConfig

        config = GPTConfig(n_layer=args.layers, n_head=4, n_embd=args.width, vocab_size=args.vocab, block_size=args.seq)
        return GPT(config).to(device), (tokens, tokens), lambda model, batch: model(*batch)
    if name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(num_classes=100).to(device)
        batch = (torch.randn(2 * args.rows, 3, 64, 64, device=device), torch.randint(0, 100, (2 * args.rows,), device=device))
        return model, batch, lambda model, batch: torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
    import transformers

    if name == "hf_gpt2":
        config = transformers.GPT2Config(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.width,
                                         n_layer=args.layers, n_head=4)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.width,
                                          intermediate_size=args.width * 8 // 3, num_hidden_layers=args.layers,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=args.seq)
        model = transformers.LlamaForCausalLM(config)
        if name == "llama_lora":
            import peft

            model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                               lora_dropout=0.0))
    model = model.to(device).train()
    return model, {"input_ids": tokens, "labels": tokens}, lambda model, batch: model(**batch).loss


def adamw(params: Any) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1)


def share_budget(fitted: Any) -> int:
    """A budget below the whole share's need: what was in use, the gradients, half the states and
    the step's unplanned activations, over fit's usable share."""
    memory = fitted.facts["memory"]
    need = memory.in_use + memory.gradients + memory.states // 2 + fitted.facts["unplanned_peak"]
    return int(need / 0.95)


def one(args: argparse.Namespace, name: str, option: str) -> dict[str, Any]:
    """One row, in this process."""
    import torch

    import stowage

    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if device.type == "cpu":
        stowage.enable(device="cpu", capacity=args.capacity)
    else:
        stowage.enable()
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    budget: Any = args.budget
    if option == "share":
        model, batch, loss_fn = build(args, name, device)
        probe = stowage.fit(model, adamw, batch, loss_fn=loss_fn, budget=budget, verbose=False, offload_parameters=False)
        budget = share_budget(probe)
        probe.close()
        del probe, model
    model, batch, loss_fn = build(args, name, device)
    started = time.perf_counter()
    fitted = stowage.fit(model, adamw, batch, loss_fn=loss_fn, budget=budget, verbose=False,
                         offload_parameters=option == "host" or (False if option == "device" else None))
    fit_s = time.perf_counter() - started
    chosen = fitted.chosen
    forward_backward, update = [], []
    try:
        for step in range(args.warmup + args.steps):
            synchronize()
            t0 = time.perf_counter()
            fitted.backward(batch)
            synchronize()
            t1 = time.perf_counter()
            fitted.optimizer.step()
            fitted.optimizer.zero_grad(set_to_none=True)
            synchronize()
            t2 = time.perf_counter()
            if step >= args.warmup:
                forward_backward.append((t1 - t0) * 1e3)
                update.append((t2 - t1) * 1e3)
    finally:
        fitted.close()
    return {
        "model": name, "option": option, "budget": budget, "fit_s": round(fit_s, 2),
        "chosen": {"fraction": chosen.fraction, "micro_batches": chosen.micro_batches,
                   "parameters_on_host": chosen.parameters_on_host,
                   "recomputes_or_offloads": not chosen.keeps_everything,
                   "optimizer": type(fitted.optimizer).__module__ + "." + type(fitted.optimizer).__qualname__},
        "predicted": {"step_ms": chosen.step_ms, "update_ms": chosen.update_ms,
                      "forward_backward_ms": chosen.step_ms - chosen.update_ms,
                      "parameter_copy_ms": chosen.parameter_copy_ms},
        "measured": {"forward_backward_ms": forward_backward, "update_ms": update,
                     "step_ms": [a + b for a, b in zip(forward_backward, update)]},
        "load": os.getloadavg()[0],
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def error(predicted: float, values: list[float]) -> str:
    return f"{(predicted / statistics.median(values) - 1) * 100:+.0f}%"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | option | chosen | predicted step | measured step, median (min-max) | error | "
             "predicted update | measured update | error | predicted fwd+bwd | measured fwd+bwd | error | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "failed" in row:
            lines.append(f"| {row['model']} | {row['option']} | failed: {row['failed'][:120]} |" + " |" * 10)
            continue
        c, p, m = row["chosen"], row["predicted"], row["measured"]
        chosen = (f"share {c['fraction']:g}" + (", blocks on host" if c["parameters_on_host"] else "") +
                  (f", {c['micro_batches']} micro" if c["micro_batches"] > 1 else "") +
                  (", plan" if c["recomputes_or_offloads"] else ""))
        lines.append(f"| {row['model']} | {row['option']} | {chosen} | {p['step_ms']:.0f} | {spread(m['step_ms'])} | "
                     f"{error(p['step_ms'], m['step_ms'])} | {p['update_ms']:.0f} | {spread(m['update_ms'])} | "
                     f"{error(p['update_ms'], m['update_ms'])} | {p['forward_backward_ms']:.0f} | "
                     f"{spread(m['forward_backward_ms'])} | {error(p['forward_backward_ms'], m['forward_backward_ms'])} | "
                     f"{row['load']:.1f} |")
    return "\n".join(lines)


def run_row(args: argparse.Namespace, forwarded: list[str], name: str, option: str, before: bool) -> dict[str, Any]:
    """One row in a fresh process, with the `--before` build first on the path where `before`."""
    environment = dict(os.environ)
    if before:  # its compiled modules find torch's libraries by a path relative to site-packages
        import importlib.util

        torch_lib = str(Path(importlib.util.find_spec("torch").origin).parent / "lib")
        environment["PYTHONPATH"] = args.before + os.pathsep + environment.get("PYTHONPATH", "")
        environment["LD_LIBRARY_PATH"] = torch_lib + os.pathsep + environment.get("LD_LIBRARY_PATH", "")
    done = subprocess.run([sys.executable, __file__, *forwarded, "--one", name, option], capture_output=True,
                          text=True, check=False, env=environment)
    found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
    row = json.loads(found[0]) if found else {"model": name, "option": option,
                                              "failed": (done.stderr.strip().splitlines() or ["?"])[-1]}
    row["build"] = "before" if before else "after"
    return row


def main() -> None:
    args = parse()
    if args.one:
        print("ROW " + json.dumps(one(args, *args.one)))
        return
    skip = {"--json", str(args.json), "--before", str(args.before)}
    forwarded = [a for a in sys.argv[1:] if a not in skip]
    rows = []
    for _ in range(args.rounds):
        for name in args.models:
            for option in args.options:
                for before in ([True, False] if args.before else [False]):
                    rows.append(run_row(args, forwarded, name, option, before))
                    print(rows[-1]["build"], table([rows[-1]]).splitlines()[-1], flush=True)
    for build in (["before", "after"] if args.before else ["after"]):
        print(f"\n{build}:\n" + table([row for row in rows if row["build"] == build]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
