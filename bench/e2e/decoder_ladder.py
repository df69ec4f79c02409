"""Public decoder shapes and a ladder of sizes between them, for the question "which decoder can I
fully fine-tune on this device": Qwen2.5's configurations (0.5B to 32B, a 151,936-token vocabulary,
biases on the query, key and value projections, tied embeddings below 7B), built from their
numbers as transformers' Qwen2Config (no download), and tiny shapes of the same family for a CPU
dry run. Between two named shapes the ladder deepens the smaller one a few layers at a time
(about a sixth of its depth a rung), so a bracketing search lands within ~15% of the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QWEN_VOCAB = 151936


@dataclass(frozen=True)
class DecoderShape:
    family: str  # the named configuration this rung deepens
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    named_layers: int  # the named configuration's own depth

    @property
    def name(self) -> str:
        return self.family if self.layers == self.named_layers else f"{self.family}@{self.layers}L"

    def block_parameters(self) -> int:
        head = self.hidden // self.heads
        attention = (self.hidden * self.hidden + self.hidden                          # q, with its bias
                     + 2 * (self.hidden * self.kv_heads * head + self.kv_heads * head)  # k, v, with theirs
                     + self.hidden * self.hidden)                                       # o
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden       # + SwiGLU MLP, norms

    def parameters(self) -> int:
        """Qwen2ForCausalLM's parameter count (the head shares the embedding's where tied)."""
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.block_parameters() + embeddings + self.hidden

    def config(self, max_sequence: int) -> Any:
        from transformers import Qwen2Config

        config = Qwen2Config(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                             num_hidden_layers=self.layers, num_attention_heads=self.heads,
                             num_key_value_heads=self.kv_heads, tie_word_embeddings=self.tied,
                             max_position_embeddings=max(max_sequence, 128), rms_norm_eps=1e-6,
                             use_cache=False)
        config._attn_implementation = "sdpa"
        return config

    def arguments(self) -> list[str]:
        """The command-line form peers_probe.py reads back (shape_from)."""
        return ["--shape", ",".join(str(v) for v in (self.family, self.hidden, self.intermediate, self.layers,
                                                     self.heads, self.kv_heads, self.vocab, int(self.tied),
                                                     self.named_layers))]


def shape_from(text: str) -> DecoderShape:
    family, *numbers = text.split(",")
    hidden, intermediate, layers, heads, kv_heads, vocab, tied, named_layers = (int(n) for n in numbers)
    return DecoderShape(family, hidden, intermediate, layers, heads, kv_heads, vocab, bool(tied), named_layers)


def named(family: str, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int,
          tied: bool) -> DecoderShape:
    return DecoderShape(family, hidden, intermediate, layers, heads, kv_heads, vocab, tied, layers)


QWEN25 = (
    named("qwen2.5-0.5b", 896, 4864, 24, 14, 2, QWEN_VOCAB, True),
    named("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, QWEN_VOCAB, True),
    named("qwen2.5-3b", 2048, 11008, 36, 16, 2, QWEN_VOCAB, True),
    named("qwen2.5-7b", 3584, 18944, 28, 28, 4, QWEN_VOCAB, False),
    named("qwen2.5-14b", 5120, 13824, 48, 40, 8, QWEN_VOCAB, False),
    named("qwen2.5-32b", 5120, 27648, 64, 40, 8, QWEN_VOCAB, False),
)
# The dry run's: the same family's proportions at a size a CPU trains in seconds
TINY = (
    named("tiny-a", 64, 176, 2, 4, 2, 2048, True),
    named("tiny-b", 96, 256, 3, 4, 2, 2048, True),
    named("tiny-c", 128, 344, 4, 4, 2, 2048, True),
    named("tiny-d", 192, 512, 4, 4, 2, 2048, False),
    named("tiny-e", 256, 688, 4, 4, 2, 2048, False),
)


def ladder(shapes: tuple[DecoderShape, ...]) -> list[DecoderShape]:
    """Every named shape, and between each and the next the smaller one deepened by about a sixth
    of its depth a rung while it stays below the next; the last deepened to twice its depth. In
    order of parameter count."""
    rungs: list[DecoderShape] = []
    for i, shape in enumerate(shapes):
        ceiling = shapes[i + 1].parameters() if i + 1 < len(shapes) else 2 * shape.parameters()
        step = max(1, round(shape.layers / 6))
        layers = shape.layers
        while True:
            rung = DecoderShape(shape.family, shape.hidden, shape.intermediate, layers, shape.heads, shape.kv_heads,
                                shape.vocab, shape.tied, shape.named_layers)
            if rung.parameters() >= ceiling and layers != shape.layers:
                break
            rungs.append(rung)
            layers += step
    return sorted(rungs, key=DecoderShape.parameters)
