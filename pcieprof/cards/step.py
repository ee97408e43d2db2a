"""What one decode step (and one prefill) of a model sends between GPUs, from its card alone.

Counting, per forward pass over T tokens (T = batch for plain decode; batch x draft tokens for
the verify pass of speculative decoding), activations in bf16 (2 bytes) unless the card's weights
are all fp32 (the reference server):
- TP: one all-reduce of T x hidden after attention and one after the MLP/MoE, every layer
  (SGLang RowParallelLinear / the MoE's final reduce), over the TP group;
- embedding: one all-reduce of T x hidden (VocabParallelEmbedding) when TP > 1;
- LM head: one all-gather of the logits, T x vocab x 2 bytes in total (LogitsProcessor gathers
  the vocab shards);
- EP with an all-to-all backend (DeepEP): per MoE layer a dispatch and a combine all-to-all of
  T x top-k x hidden x 2 bytes in total, instead of the all-reduce after the MoE;
- DP attention (SGLang --enable-dp-attention): attention is data parallel over dp groups of
  attn_tp = TP/dp GPUs; per layer the tokens are gathered for the MoE with an all-reduce of
  T x hidden over all TP ranks (SGLang dp_attention.py `_dp_gather_via_all_reduce`), the MoE
  reduces with another, and attention all-reduces over attn_tp only when attn_tp > 1;
- PP: one point-to-point send of the hidden state and the residual (2 x T x hidden x 2 bytes)
  between consecutive stages; in decode the stages run one after the other, so every stage's
  collectives add up on the critical path;
- MTP speculative decoding (EAGLE with the model's NextN layer): `spec_steps` draft passes, each
  one MTP layer (2 all-reduces of batch x hidden) plus the LM-head all-gather, then the verify
  pass of the whole model over batch x draft_tokens tokens.
A prefill of T prompt tokens sends the same collectives as a forward pass over T tokens; with
chunked prefill (SGLang --chunked-prefill-size) T is at most the chunk.

Pricing these with measured curves is pcieprof.analysis.comm_model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pcieprof.cards.card import ModelCard
from pcieprof.errors import BadInput

ALL_REDUCE, ALL_GATHER, ALL_TO_ALL, P2P = "all_reduce", "all_gather", "all_to_all", "p2p"


@dataclass(frozen=True)
class Layout:
    """A parallel layout of one model replica.

    Attributes:
        tp: tensor-parallel size (GPUs per pipeline stage).
        ep: expert-parallel size (1 = experts sharded by TP).
        pp: pipeline stages.
        dp_attention: SGLang --enable-dp-attention with `dp` attention groups.
        dp: data-parallel attention groups (defaults to tp when dp_attention).
        moe_a2a: "none" (MoE reduced with an all-reduce) or "deepep" (dispatch/combine all-to-all).
        speculative: MTP speculative decoding on.
        spec_steps: draft passes per step (SGLang --speculative-num-steps).
        draft_tokens: tokens verified per request (SGLang --speculative-num-draft-tokens).
    """

    tp: int = 8
    ep: int = 1
    pp: int = 1
    dp_attention: bool = False
    dp: int | None = None
    moe_a2a: str = "none"
    speculative: bool = False
    spec_steps: int = 3
    draft_tokens: int = 4

    def __post_init__(self) -> None:
        if self.tp < 1 or self.ep < 1 or self.pp < 1:
            raise BadInput(f"layout sizes must be >= 1 (tp={self.tp}, ep={self.ep}, pp={self.pp})")
        if self.moe_a2a not in ("none", "deepep"):
            raise BadInput(f"moe_a2a must be 'none' or 'deepep', not {self.moe_a2a!r}")
        if self.ep > self.tp:
            raise BadInput(f"ep={self.ep} larger than tp={self.tp}: EP groups live inside the TP group")
        if self.dp_attention and self.tp % self.dp_groups:
            raise BadInput(f"tp={self.tp} not divisible by dp={self.dp_groups}")

    @property
    def dp_groups(self) -> int:
        return (self.dp or self.tp) if self.dp_attention else 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def label(self) -> str:
        s = f"TP{self.tp}"
        if self.ep > 1:
            s += f" EP{self.ep}" + ("(deepep)" if self.moe_a2a == "deepep" else "")
        if self.pp > 1:
            s = f"PP{self.pp} x " + s
        if self.dp_attention:
            s += f" DP-attn{self.dp_groups}"
        if self.speculative:
            s += f" MTP{self.spec_steps}/{self.draft_tokens}"
        return s


@dataclass(frozen=True)
class Collective:
    """One kind of collective in a decode step.

    Attributes:
        op: all_reduce | all_gather | all_to_all | p2p.
        where: what it serves ("attention out", "moe out", "lm_head", "pp send", ...).
        group_size: ranks taking part.
        size_bytes: message size (all-reduce: the tensor; all-gather/all-to-all: the total).
        count: how many per decode step.
        phase: "decode", "verify" or "draft".
    """

    op: str
    where: str
    group_size: int
    size_bytes: int
    count: int
    phase: str = "decode"


def _forward(card: ModelCard, layout: Layout, tokens: int, phase: str, a: int) -> list[Collective]:
    """Collectives of one forward pass of the whole model over `tokens` tokens."""
    h, tp = card.hidden_size, layout.tp
    out: list[Collective] = []
    msg = tokens * h * a
    dense, moe = card.num_dense_layers, card.num_moe_layers
    layers = dense + moe
    if layers != card.num_layers:  # a card whose split does not add up: trust num_layers
        dense, moe = card.num_layers - moe, moe
        layers = card.num_layers
    if tp > 1:
        out.append(Collective(ALL_REDUCE, "embedding", tp, msg, 1, phase))
        if layout.dp_attention:
            attn_tp = tp // layout.dp_groups
            if attn_tp > 1:
                local = max(1, math.ceil(tokens / layout.dp_groups))
                out.append(Collective(ALL_REDUCE, "attention out (attn TP)", attn_tp,
                                      local * h * a, layers, phase))
            out.append(Collective(ALL_REDUCE, "dp gather", tp, msg, layers, phase))
        else:
            out.append(Collective(ALL_REDUCE, "attention out", tp, msg, layers, phase))
        if dense:
            out.append(Collective(ALL_REDUCE, "mlp out", tp, msg, dense, phase))
        if moe:
            if layout.ep > 1 and layout.moe_a2a == "deepep":
                a2a = tokens * card.experts_per_token * h * a
                out.append(Collective(ALL_TO_ALL, "moe dispatch", layout.ep, a2a, moe, phase))
                out.append(Collective(ALL_TO_ALL, "moe combine", layout.ep, a2a, moe, phase))
            else:
                out.append(Collective(ALL_REDUCE, "moe out", tp, msg, moe, phase))
        out.append(Collective(ALL_GATHER, "lm_head logits", tp, tokens * card.vocab_size * a, 1, phase))
    if layout.pp > 1:
        out.append(Collective(P2P, "pp send (hidden + residual)", 2, 2 * msg, layout.pp - 1, phase))
    return out


def count_collectives(card: ModelCard, layout: Layout, batch: int) -> list[Collective]:
    """The collectives of one decode step at batch size `batch` (requests decoding together).

    Args:
        card: the model (num_layers, num_dense_layers, num_moe_layers, hidden_size,
            vocab_size, experts_per_token, mtp_layers).
        layout: the parallel layout.
        batch: requests in the step (each decodes one token, or draft_tokens when speculative).
    """
    if batch < 1:
        raise BadInput(f"batch must be >= 1 (got {batch})")
    a = card.activation_bytes
    if not layout.speculative:
        return _forward(card, layout, batch, "decode", a)
    if card.mtp_layers < 1:
        raise BadInput(f"{card.name} has no MTP layer: speculative decoding with MTP needs one")
    out = _forward(card, layout, batch * layout.draft_tokens, "verify", a)
    h, tp = card.hidden_size, layout.tp
    if tp > 1:
        steps = layout.spec_steps
        msg = batch * h * a
        out.append(Collective(ALL_REDUCE, "mtp attention + moe out", tp, msg, 2 * steps, "draft"))
        out.append(Collective(ALL_REDUCE, "mtp embedding", tp, msg, steps, "draft"))
        out.append(Collective(ALL_GATHER, "mtp lm_head logits", tp, batch * card.vocab_size * a,
                              steps, "draft"))
    return out


def step_allreduces(card: ModelCard, tp: int, batch: int = 1) -> int:
    """All-reduces over the whole TP group in one plain decode step of `card` at TP `tp` (the
    embedding's, two per layer; GLM-5 at TP8: 1 + 78 + 3 + 75 = 157)."""
    return sum(c.count for c in count_collectives(card, Layout(tp=tp), batch)
               if c.op == ALL_REDUCE and c.group_size == tp)


def message_bytes(card: ModelCard, tokens: int) -> int:
    """The all-reduce message of a forward pass over `tokens` tokens: tokens x hidden x the
    activation's bytes (decode: tokens = the batch; prefill: the prompt chunk)."""
    if tokens < 1:
        raise BadInput(f"tokens must be >= 1 (got {tokens})")
    return tokens * card.hidden_size * card.activation_bytes


#: Prompt chunks whose prefill all-reduce `prefill_sizes` gives: SGLang's --chunked-prefill-size
#: default of 8192 tokens and 16384 (glm5-nvfp4.toml's [S6] setting), and a 2048-token prompt.
PREFILL_TOKENS = (2048, 8192, 16384)


def prefill_sizes(card: ModelCard, tokens: tuple[int, ...] = PREFILL_TOKENS) -> tuple[int, ...]:
    """The all-reduce messages of prefill chunks of `tokens` tokens (bytes)."""
    return tuple(message_bytes(card, t) for t in tokens)
