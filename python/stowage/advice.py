"""Advice the inspector gives: each rule names a waste it sees in the trace, the bytes the peak
would lose without it, and the call that removes it.

The saving is computed from the trace, not guessed: the live-bytes series is re-simulated
without the allocations the advice would remove (every one of the waste's, over the whole trace,
from its allocation to its free: moving the optimizer to the host takes its states and its
update's temporaries; offloading activations takes every step's) and the new peak taken; the
saving is the old peak less the new.

Rules (each fires only where its waste is at least MIN_SHARE of the peak):
- optimizer states at the peak -> stowage.offload.AdamW (states in host memory) or stowage.fit;
- activations at the peak -> checkpointing each block, offload, or a plan (stowage.plan /
  stowage.fit). Where the snapshot names the module that made each allocation (stowage's own,
  tagged), the saving is the trace re-simulated with each block checkpointed
  (stowage.recompute_estimate); elsewhere the saving of removing them all, an upper bound;
- tensors made in a forward that outlive it with no backward (a graph kept: evaluation without
  torch.no_grad()) -> torch.no_grad() / torch.inference_mode() around it;
- gradients at the peak made in an earlier step (kept across steps: zero_grad(set_to_none=False),
  or none) -> optimizer.zero_grad(set_to_none=True) after each step (snapshot/peak_estimates.hpp says
  how the step then runs);
- memory that grows at every step -> the site that keeps it (a loss kept with its graph: .item()
  or .detach()); the saving: the trace without that site's allocations that outlive their step;
- an out-of-memory with enough bytes free but no block whole (reserved but unallocated) ->
  stowage's allocator, with the replay's peak reserved where the inspector has it;
- inputs at the peak -> a smaller batch or micro-batches (stowage.fit(..., micro_batches="auto"));
- logit-sized tensors at the peak (sizes the loss function itself allocates) -> a chunked loss.

Contract: pure functions of the inspector's findings and the trace's LivePairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from stowage import _core, recompute_estimate
from stowage._core import format_bytes

MIN_SHARE = 0.10

CALLS = {
    "optimizer states": "keep them in host memory: stowage.offload.AdamW(params, ...) in place of torch's, or "
                        "stowage.fit(model, factory, batch) to choose the share",
    "activations": "recompute or offload them: checkpoint each block (torch.utils.checkpoint, or "
                   "model.gradient_checkpointing_enable() in transformers), `with stowage.offload.activations():` "
                   "around forward and backward, or a plan choosing per tensor (stowage.fit, stowage.plan)",
    "inputs": "train on smaller micro-batches of the same global batch: stowage.fit(..., micro_batches=\"auto\")",
}


@dataclass
class Evidence:
    """What the rules read of a trace: its live-bytes series and LivePairs, the peak's position,
    the positions live there and their categories, where steps begin; and, computed when a rule
    needs them, every position's category with whether it was made under torch.optim
    (`every`), the allocations a forward left with no backward (`kept_without_backward`), and
    the module of each position with the paths (`modules`: only in snapshots stowage tagged)."""

    live: np.ndarray
    pairs: Any
    peak_position: int
    live_at: np.ndarray
    category_at: np.ndarray
    step_starts: np.ndarray
    every: Callable[[], tuple[np.ndarray, np.ndarray]]
    kept_without_backward: Callable[[], np.ndarray]
    kept_across_steps: Callable[[str], np.ndarray]  # a site's allocations kept into later steps, not for backward
    backward_allocations: Callable[[], np.ndarray]  # positions of backward's allocations
    loss_allocations: Callable[[], np.ndarray]  # positions of a loss function's allocations in forward
    modules: tuple[np.ndarray, list[str]] | None = None


def _category_rules(peak: dict[str, Any], facts: Evidence, total: int) -> list[dict[str, Any]]:
    """States, activations and inputs at the peak: their saving re-simulated."""
    from stowage.categories import ACTIVATIONS, CATEGORIES

    wasted = {name: int(peak.get("categories", {}).get(name, 0)) for name in CALLS}
    if all(waste < MIN_SHARE * total for waste in wasted.values()):
        return []
    pairs, everything_and_optimizer = facts.pairs, facts.every()
    everything, optimizer = everything_and_optimizer
    found = []
    for name, call in CALLS.items():
        if wasted[name] < MIN_SHARE * total:
            continue
        removed = everything == CATEGORIES.index(name)
        if name == "optimizer states":
            removed |= optimizer & pairs.is_alloc  # the update's temporaries go to the host with it
        blocks: list[str] = []
        if name == "activations" and facts.modules is not None:
            module, paths = facts.modules
            of_path, blocks = recompute_estimate.block_of_paths(paths)
        bound = name == "activations" and not blocks  # (no module paths, or no blocks among them)
        if blocks:
            saving = total - _core.checkpointed_peak(facts.live, pairs.is_alloc, pairs.end, pairs.size, pairs.own,
                                                     np.flatnonzero(everything == ACTIVATIONS), of_path[module])
            how = f" (each of the {len(blocks)} blocks checkpointed, e.g. {blocks[0]})"
        else:
            saving = total - _core.removed_peak(facts.live, pairs.end, pairs.size, np.flatnonzero(removed))
            how = (f" (at most {format_bytes(saving)}: backward brings them back a block at a time)" if bound else "")
        found.append({"rule": name, "waste_bytes": wasted[name], "saving_bytes": saving, "upper_bound": bound,
                      "advice": f"{format_bytes(wasted[name])} of {name} live at the peak; {call}{how}"})
    return found


def _kept_without_backward(facts: Evidence, total: int) -> list[dict[str, Any]]:
    kept = facts.kept_without_backward()
    waste = int(np.asarray(facts.pairs.size[np.intersect1d(kept, facts.live_at)], dtype=np.int64).sum())
    if waste < MIN_SHARE * total:
        return []
    pairs = facts.pairs
    saving = total - _core.removed_peak(facts.live, pairs.end, pairs.size, kept)
    return [{"rule": "forward without backward", "waste_bytes": waste, "saving_bytes": saving,
             "advice": f"{format_bytes(waste)} made in a forward that had no backward are live at the peak (autograd "
                       "kept its graph): run evaluation and inference under torch.no_grad() or torch.inference_mode()"}]


LOSS_CHUNKS = 8  # the chunks a chunked loss is advised in


def _logits(facts: Evidence, total: int) -> list[dict[str, Any]]:
    """Logit-sized tensors at the peak: the sizes of the loss's own large allocations (its
    log-softmax, an upcast or shifted copy of the logits; half of one: logits in 16 bits), live
    at the peak outside parameters, gradients and states. A chunked loss holds one chunk of each
    at a time: the saving is the trace re-simulated with every such allocation LOSS_CHUNKS
    times smaller. (A loss already chunked is advised again while one chunk's logits are still a
    tenth of the peak: more chunks save more.)"""
    from stowage.categories import GRADIENTS, PARAMETERS, STATES

    pairs = facts.pairs
    made = facts.loss_allocations()
    sizes = np.asarray(pairs.size[made], dtype=np.int64)
    large = np.unique(sizes[sizes >= total // 100])
    if not len(large):
        return []
    logit_sizes = np.union1d(large, large // 2)
    everything, _ = facts.every()
    other = ~np.isin(everything, (PARAMETERS, GRADIENTS, STATES))
    all_sizes = np.asarray(pairs.size, dtype=np.int64)
    logit_like = pairs.is_alloc & other & np.isin(all_sizes, logit_sizes)
    at_peak = facts.live_at[logit_like[facts.live_at]]
    waste = int(all_sizes[at_peak].sum())
    if waste < MIN_SHARE * total:
        return []
    chosen = np.flatnonzero(logit_like)
    change = np.zeros(len(facts.live) + 1, dtype=np.int64)
    cut = all_sizes[chosen] - all_sizes[chosen] // LOSS_CHUNKS
    np.add.at(change, chosen, -cut)
    np.add.at(change, pairs.end[chosen], cut)
    saving = total - _core.changed_peak(facts.live, change[:len(facts.live)])
    return [{"rule": "logits at the peak", "waste_bytes": waste, "saving_bytes": saving,
             "advice": f"{format_bytes(waste)} of logit-sized tensors (the output layer's, and the loss's copies and "
                       f"their gradients) are live at the peak: compute the loss in {LOSS_CHUNKS} chunks of the tokens, "
                       "each chunk's logits made and used in turn and recomputed in backward (a chunked cross-entropy, "
                       "as stowage.models.llama.Llama.chunked_loss does, or Liger's and torchtune's)"}]


def advise(peak: dict[str, Any], facts: Evidence, growing: list[dict[str, Any]],
           ooms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules' advice, largest saving first."""
    from stowage.categories import CATEGORIES

    total = max(int(peak["live_bytes"]), 1)
    found = _category_rules(peak, facts, total) if facts.peak_position >= 0 else []
    if facts.peak_position >= 0:
        found += _kept_without_backward(facts, total)
        found += _logits(facts, total)
    pairs, step_starts = facts.pairs, facts.step_starts
    gradients = facts.live_at[facts.category_at == CATEGORIES.index("gradients")]
    if len(step_starts) and len(gradients):
        step_of_peak = np.searchsorted(step_starts, facts.peak_position, side="right")
        kept = gradients[np.searchsorted(step_starts, gradients, side="right") < step_of_peak]
        waste = int(np.asarray(pairs.size[kept], dtype=np.int64).sum())
        if waste >= MIN_SHARE * total:
            backward = facts.backward_allocations()
            bound = not len(backward)  # (backward not found: the gradients taken out, a bound)
            saving = total - (_core.removed_peak(facts.live, pairs.end, pairs.size, kept) if bound else
                              _core.grads_set_to_none_peak(facts.live, pairs.is_alloc, pairs.end, pairs.size,
                                                                    kept, backward, step_starts))
            found.append({"rule": "gradients kept across steps", "waste_bytes": waste, "saving_bytes": saving,
                          "upper_bound": bound,
                          "advice": f"{format_bytes(waste)} of gradients made in an earlier step are live at the peak: "
                                    "optimizer.zero_grad(set_to_none=True) after each step"})
    for row in growing[:1]:  # named by the site that grows most; the saving counts every growing site
        kept = np.unique(np.concatenate([facts.kept_across_steps(r["site"]) for r in growing]))
        saving = total - _core.freed_when_made_peak(facts.live, pairs.end, pairs.size, kept,
                                                             facts.backward_allocations(), step_starts) if len(kept) else 0
        more = f" (and {len(growing) - 1} more sites)" if len(growing) > 1 else ""
        found.append({"rule": "memory growing every step", "waste_bytes": row["bytes_per_step"] * row["steps"],
                      "saving_bytes": saving,
                      "advice": f"{row['site']}{more} keeps {format_bytes(row['bytes_per_step'])} more after every "
                                "step: keep numbers, not tensors (loss.item()), or detach what is kept (tensor.detach())"})
    for oom in ooms[:1]:
        short = int(oom["requested"]) - int(oom["device_free"])
        cached = int(oom.get("cached_free", 0))
        if short > 0 and cached >= short:
            replayed = oom.get("stowage_peak_reserved")
            found.append({"rule": "out of memory with the bytes free in pieces", "waste_bytes": cached,
                          "saving_bytes": short,
                          "advice": f"the request was {format_bytes(short)} short of the device's free bytes while "
                                    f"the cache held {format_bytes(cached)} free in pieces: stowage's allocator "
                                    "(STOWAGE_ALLOC_CONF= or stowage.enable())" +
                                    (f", whose replay of this trace peaks at {format_bytes(replayed)} reserved"
                                     if replayed else "")})
    return sorted((row for row in found if row["saving_bytes"] > 0), key=lambda row: row["saving_bytes"], reverse=True)
