"""GPU memory of a served model, per layout, counted the way SGLang lays the weights out.

SGLang holds on each GPU (pinned release 0.5.23, sglang/srt/models/deepseek_v2.py and
layers/attention/dsa/dsa_indexer.py):
- the tensor-parallel parts split over the TP group (experts, dense MLP, q_b/kv_b/o of MLA,
  the vocab-parallel lm_head);
- whole copies of the ReplicatedLinear parts on every GPU: MLA's `fused_qkv_a_proj_with_mqa`
  (hidden x (q_lora + kv_lora + rope)), the DSA indexer's `wq_b`, `wk`, `weights_proj`, and the
  MoE router (`MoEGate.weight`, experts x hidden);
- with DP attention (`--attn-dp-size D`), the attention weights split over the attention-TP
  group of TP/D GPUs only (`parallel_group="attn_tp"`), so at D = TP every GPU holds all of
  them; the input embedding is vocab-split over that group too (get_embedding_tp_kwargs:
  `use_attn_tp_group=is_dp_attention_enabled()`);
- with PP, a stage holds its layers (an even split assumed; the stages holding the embedding
  or the lm_head hold a little more);
- the KV pool in what --mem-fraction-static leaves after the weights: weights + KV <=
  fraction x GPU memory. MLA caches one latent per token on every attention-TP rank.

Units: bytes here; GiB (pcieprof.analysis.box.gib) wherever a number is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcieprof.analysis.box import GIB, Box, gib
from pcieprof.cards import ModelCard

#: SGLang's --mem-fraction-static when the card does not say: weights + KV must fit in it.
DEFAULT_MEM_FRACTION = 0.85


def mem_fraction(card: ModelCard) -> float:
    """The card's --mem-fraction-static, else DEFAULT_MEM_FRACTION."""
    flags = list(card.sglang.recommended_flags)
    if "--mem-fraction-static" in flags:
        try:
            return float(flags[flags.index("--mem-fraction-static") + 1])
        except (IndexError, ValueError):
            pass
    return DEFAULT_MEM_FRACTION


def _group(card: ModelCard, name: str) -> tuple[float, float]:
    """(bytes, bytes per parameter) of a weight group; (0, 2) when the card lacks it."""
    g = card.weights.get(name)
    return (float(g.bytes), float(g.bytes_per_param)) if g is not None else (0.0, 2.0)


def replicated_attention_bytes(card: ModelCard) -> float:
    """Bytes of the attention weights SGLang keeps whole on every TP rank (all layers): MLA's
    fused q_a/kv_a projection and the DSA indexer; 0 for attention types without them."""
    a = card.attention
    if not a.type.startswith("mla") or not a.q_lora_rank or not a.kv_lora_rank:
        return 0.0
    per_layer = card.hidden_size * (a.q_lora_rank + a.kv_lora_rank + (a.qk_rope_head_dim or 0))
    if a.index_n_heads and a.index_head_dim:
        per_layer += (a.q_lora_rank * a.index_n_heads * a.index_head_dim   # wq_b
                      + card.hidden_size * a.index_head_dim                # wk
                      + card.hidden_size * a.index_n_heads)                # weights_proj
    total, bpp = _group(card, "attention")
    return min(per_layer * card.num_layers * bpp, total)


@dataclass(frozen=True)
class Placement:
    """How one replica of the model is split: TP x PP GPUs, optionally DP attention."""

    tp: int
    pp: int = 1
    dp_attention: int = 0  # --attn-dp-size; 0: off

    @property
    def attn_tp(self) -> int:
        """GPUs one attention group splits the attention weights over."""
        return max(1, self.tp // self.dp_attention) if self.dp_attention else self.tp


def weights_per_gpu(card: ModelCard, p: Placement) -> float:
    """Weight bytes on each GPU (see the module docstring for the split)."""
    attn, _ = _group(card, "attention")
    router, _ = _group(card, "router")
    emb, _ = _group(card, "embedding")
    rep_attn = replicated_attention_bytes(card)
    split_attn = attn - rep_attn
    rest = float(card.weight_bytes) - attn - router - emb
    on_gpu = (rest / p.tp + emb / (p.attn_tp if p.dp_attention else p.tp)
              + split_attn / p.attn_tp + rep_attn + router)
    return on_gpu / p.pp


def kv_per_request(card: ModelCard, p: Placement, context: int) -> float:
    """KV bytes one request of `context` tokens costs on each GPU holding its cache."""
    return card.kv_bytes_per_token_per_gpu(p.attn_tp if p.dp_attention else p.tp, p.pp) * context


@dataclass(frozen=True)
class Fit:
    """Whether a placement fits one GPU of the box.

    An assumed memory is a range (pcieprof.analysis.box.Box.memory_low_bytes): the fit is
    checked at both ends, and one that holds at the high end only is uncertain, not yes or no.

    Attributes:
        needs: weight bytes per GPU.
        has: bytes for weights + KV per GPU (memory x mem-fraction), None when memory is unknown.
        memory: the GPU's memory (bytes), None when unknown; of a range, its high end.
        fraction: --mem-fraction-static.
        kv_request: KV bytes of one request per GPU.
        requests_per_gpu: requests whose KV fits one GPU (0 when the weights do not fit).
        memory_source: where the GPU memory came from.
        memory_low: the low end of an assumed memory's range (bytes), None when not a range.
        requests_low: `requests_per_gpu` at `memory_low`, None when not a range.
    """

    needs: float
    has: float | None
    memory: float | None
    fraction: float
    kv_request: float
    requests_per_gpu: int
    memory_source: str
    memory_low: float | None = None
    requests_low: int | None = None

    @property
    def uncertain(self) -> bool:
        """True when it fits at the high end of the assumed memory's range and not at the low."""
        return (self.has is not None and self.requests_per_gpu >= 1
                and self.requests_low is not None and self.requests_low < 1)

    @property
    def fits(self) -> bool | None:
        """True / False; None when the GPU memory is unknown or the fit is `uncertain`."""
        if self.has is None or self.uncertain:
            return None
        return self.requests_per_gpu >= 1

    def _has(self) -> str:
        """`has 81.6 = 96.0 GiB x --mem-fraction-static 0.85`, the range of an assumed one."""
        mem = self.memory or 0.0
        low = self.memory_low
        if low is not None and round(low / GIB, 1) != round(mem / GIB, 1):
            has = (f"has {low * self.fraction / GIB:.1f}-{mem * self.fraction / GIB:.1f} = "
                   f"{low / GIB:.1f}-{mem / GIB:.1f} GiB x --mem-fraction-static "
                   f"{self.fraction:g}")
        else:
            has = (f"has {mem * self.fraction / GIB:.1f} = {gib(mem)} x --mem-fraction-static "
                   f"{self.fraction:g}")
        if self.memory_source.startswith("assumed"):
            has += f" ({self.memory_source})"  # an assumed size is said where it decides
        return has

    def requests_text(self) -> str:
        """`30`, or `28-30` across an assumed memory's range."""
        if self.requests_low is not None and self.requests_low != self.requests_per_gpu:
            return f"{self.requests_low}-{self.requests_per_gpu}"
        return str(self.requests_per_gpu)

    def verdict(self) -> str:
        """`does not fit this box (needs 210.3 GiB per GPU, has 20.4)`, `fits (...)`,
        `fit uncertain (...)` or `fit not checked (...)`."""
        if self.has is None:
            return (f"fit not checked: {self.memory_source} (needs {gib(self.needs)} of weights "
                    f"per GPU)")
        if self.requests_per_gpu < 1:
            return (f"does not fit this box (needs {gib(self.needs + self.kv_request)} per GPU "
                    f"for the weights and one request's KV, {self._has()})")
        if self.uncertain:
            return (f"fit uncertain: needs {gib(self.needs + self.kv_request)} per GPU for the "
                    f"weights and one request's KV; fits at {gib(self.memory or 0.0)} (KV room "
                    f"for {self.requests_per_gpu} request(s) per GPU), not at "
                    f"{gib(self.memory_low or 0.0)}: {self._has()}")
        return (f"fits: {gib(self.needs)} of weights per GPU, {self._has()}, KV room for "
                f"{self.requests_text()} request(s) per GPU")


def _requests(room: float, kv: float) -> int:
    """Requests whose KV fits `room` bytes (0 when the weights do not fit)."""
    return int(room // kv) if room > 0 and kv > 0 else (1 << 30 if room > 0 else 0)


def fit(card: ModelCard, p: Placement, box: Box | None, context: int,
        fraction: float | None = None) -> Fit:
    """The memory fit of `p` on one GPU of `box` at `context` tokens per request, at both ends
    of the box's assumed memory range where it has one."""
    frac = fraction if fraction is not None else mem_fraction(card)
    need = weights_per_gpu(card, p)
    kv = kv_per_request(card, p, context)
    mem = box.memory_bytes if box is not None else None
    src = box.memory_source if box is not None else "no box"
    if mem is None:
        return Fit(need, None, None, frac, kv, 0, src)
    low = box.memory_low_bytes if box is not None else None
    return Fit(need, mem * frac, mem, frac, kv, _requests(mem * frac - need, kv), src, low,
               _requests(low * frac - need, kv) if low is not None else None)


def widest_tp(card: ModelCard, gpus: int) -> int:
    """The largest TP size <= `gpus` that divides the attention heads (SGLang asserts
    num_heads % attn_tp_size == 0)."""
    heads = max(1, card.attention.num_heads)
    return max((t for t in range(1, max(gpus, 1) + 1) if heads % t == 0), default=1)
