"""The model card: what pcieprof knows of a served model (pcieprof.cards).

A card holds what the analysis needs (layers, dense/MoE split, hidden size, experts, attention
shape, vocab), the weight bytes per parameter group, the KV-cache bytes per token per layer, and
the launch facts (SGLang flags and environment, or the reference server's module). Each number
carries its source (`sources`); what is an estimate is listed under `assumed`.

Parameter groups (whole model; per layer x layers), as pcieprof.cards.hf_config derives them:
  attention  GQA: q hidden x heads x head_dim + k, v hidden x kv_heads x head_dim each
                  + o heads x head_dim x hidden
             MLA: q_a hidden x q_lora + q_b q_lora x heads x (nope + rope) + kv_a hidden x
                  (kv_lora + rope) + kv_b kv_lora x heads x (nope + v) + o heads x v x hidden
                  (+ the DSA indexer)
  routed_experts / shared_experts  3 x hidden x moe_intermediate each (gate, up, down)
  dense_mlp  3 x hidden x dense_intermediate
  router     experts x hidden per MoE layer
  embedding / lm_head  vocab x hidden (lm_head absent when tied)
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pcieprof.errors import BadInput

@dataclass(frozen=True)
class AttentionSpec:
    """Attention shape. Fields that do not apply to `type` are None.

    Attributes:
        type: `mha`, `gqa`, `mla` or `mla_dsa` (MLA with DeepSeek Sparse Attention).
        num_heads: query heads.
        num_kv_heads: key/value heads (MLA: equal to num_heads; the cache holds one latent).
        head_dim: per-head dimension for MHA/GQA.
        q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim: MLA shape.
        index_topk, index_n_heads, index_head_dim: DSA indexer (tokens kept, heads, dim).
    """

    type: str
    num_heads: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    index_topk: int | None = None
    index_n_heads: int | None = None
    index_head_dim: int | None = None


@dataclass(frozen=True)
class WeightGroup:
    """One group of parameters stored in one format.

    Attributes:
        params: number of parameters in the group (whole model).
        dtype: storage format (`bf16`, `fp8`, `nvfp4`, `fp32`).
        bytes_per_param: bytes per parameter including block scales (NVFP4: 0.5625).
    """

    params: int
    dtype: str
    bytes_per_param: float

    @property
    def bytes(self) -> float:
        """Bytes the group occupies in total."""
        return self.params * self.bytes_per_param


@dataclass(frozen=True)
class KVCacheSpec:
    """KV cache cost.

    Attributes:
        dtype: cache dtype.
        bytes_per_token_per_layer: bytes one token costs in one layer (whole model, one replica).
        replicated_across_tp: True when every TP rank holds the full cache (MLA latents),
            False when it is sharded by heads.
    """

    dtype: str
    bytes_per_token_per_layer: int
    replicated_across_tp: bool = False


#: `LaunchTarget.fabric` / `BoxSetting.fabric` values: no NVLink between any two GPUs (PCIe
#: only), NVLink between some.
PCIE, NVLINK = "pcie", "nvlink"


#: Card settings a launch carries only where a bundle of the box priced them (the tuner passes
#: them in its recommended environment) or the user sets them (--env): NCCL_P2P_LEVEL puts peer
#: traffic on P2P at every distance, through the host IOMMU in a VM, where NCCL can hang on its
#: first collective (pcieprof.tune.vm_context); a card's source box is no evidence for this one.
NEEDS_EVIDENCE = ("NCCL_P2P_LEVEL",)


@dataclass(frozen=True)
class LaunchTarget:
    """The box a launch line is for, as far as the caller knows it.

    Attributes:
        arch: GPU architecture (`sm120`), "" when unknown.
        arch_source: where `arch` came from, or why it is unknown.
        fabric: `pcie` (no NVLink between any two GPUs), `nvlink` (NVLink between some), ""
            when unknown.
        fabric_source: where `fabric` came from, or why it is unknown.
    """

    arch: str = ""
    arch_source: str = "architecture unknown"
    fabric: str = ""
    fabric_source: str = "fabric unknown"


@dataclass(frozen=True)
class BoxSetting:
    """Launch flags and environment for some boxes only: the card's source box had them for a
    reason that holds on its architecture or fabric, not everywhere.

    Attributes:
        flags: argv tokens added where the conditions hold.
        env: environment variables set where the conditions hold.
        arch: the architectures it is for (empty: any).
        fabric: `pcie` or `nvlink` (empty: any).
        why: one line: what it does and why it is for these boxes only.
        source: the card's citation keys (and source files) behind it.
    """

    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    arch: tuple[str, ...] = ()
    fabric: str = ""
    why: str = ""
    source: str = ""

    def words(self) -> str:
        """The setting as a launch line writes it: `K=V ... --flag ...`."""
        return " ".join([*(f"{k}={v}" for k, v in self.env.items()), *self.flags])

    def keys(self) -> str:
        """The citation keys of `source` (`S6, S7`), for a one-line mention."""
        return ", ".join(dict.fromkeys(re.findall(r"\b[A-Z]+\d+\b", self.source))) or self.source

    def condition(self) -> str:
        """`for sm120, PCIe-only boxes`."""
        parts = ["/".join(self.arch)] if self.arch else []
        if self.fabric:
            parts.append({PCIE: "PCIe-only", NVLINK: "NVLink"}.get(self.fabric, self.fabric))
        return "for " + ", ".join(parts) + " boxes" if parts else "for every box"

    def verdict(self, target: LaunchTarget | None) -> tuple[bool | None, str]:
        """(True, "") where every condition holds on `target`; (False, why not) where one
        fails; (None, what is unknown) where none fails but one cannot be told."""
        t = target if target is not None else LaunchTarget()
        unknown = []
        if self.arch:
            if not t.arch:
                unknown.append(f"the box's architecture is unknown ({t.arch_source})")
            elif t.arch not in self.arch:
                return False, f"this box is {t.arch} ({t.arch_source})"
        if self.fabric:
            if not t.fabric:
                unknown.append(f"the box's fabric is unknown ({t.fabric_source})")
            elif t.fabric != self.fabric:
                what = "has NVLink" if t.fabric == NVLINK else "is PCIe-only"
                return False, f"this box {what} ({t.fabric_source})"
        if unknown:
            return None, "; ".join(unknown)
        return True, ""


@dataclass(frozen=True)
class BoxFit:
    """A card's box settings resolved against one box (`LaunchFacts.for_box`).

    Attributes:
        flags: the card's flags for this box (its general ones, then the box settings that hold).
        env: the card's environment for this box.
        applied: one line per box setting set, with its condition and reason.
        not_for_box: one line per box setting left out because the box is another.
        unknown: one line per box setting left out because the box does not tell a condition
            (said with the launch line: a caveat).
    """

    flags: tuple[str, ...]
    env: dict[str, str]
    applied: tuple[str, ...] = ()
    not_for_box: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchFacts:
    """How to start a server for this model.

    Attributes:
        launch_module: `python -m` module (`sglang.launch_server`, or `pcieprof.refserver`).
        model_path: default --model-path (an HF checkpoint name).
        quantization: --quantization value ("" for none).
        kv_cache_dtype: --kv-cache-dtype value ("" for the server default).
        tp_default: default --tp-size.
        gpu_memory_gib: GPU memory per GPU the defaults assume (GiB: a nominal "96 GB" card
            holds 96 GiB), 0 for CPU.
        gpu_memory_nvml_mib: the total NVML reports on that GPU (MiB, after the driver's
            reservation: 97887 on a "96 GB" RTX PRO 6000), the low end of the assumed
            memory's range; 0 when not known (the assumed memory is then a point).
        attention_backend: default --attention-backend ("" for the server default).
        recommended_flags: extra argv tokens added on every box.
        env: environment variables set on every box.
        box_settings: flags and environment for some boxes only (`for_box`).
        fabric: the fabric of the box the card's launch facts were written on (`pcie`,
            `nvlink`, ""), the box serve-bench assumes when it sees no GPU (as it takes the
            card's architecture then).
        backend: `cuda` for SGLang, `cpu` for the reference server.
        startup_timeout_s: longest start-up of one launch attempt (s).
        stall_timeout_s: an attempt whose log shows no start-up progress this long is hung (s).
        probe_timeout_s: longest correctness probe after start-up (s).
    """

    launch_module: str
    model_path: str = ""
    quantization: str = ""
    kv_cache_dtype: str = ""
    tp_default: int = 1
    gpu_memory_gib: float = 0.0
    gpu_memory_nvml_mib: float = 0.0
    attention_backend: str = ""
    recommended_flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    box_settings: tuple[BoxSetting, ...] = ()
    fabric: str = ""
    backend: str = "cuda"
    startup_timeout_s: float = 1800.0
    stall_timeout_s: float = 300.0
    probe_timeout_s: float = 300.0

    def for_box(self, target: LaunchTarget | None) -> BoxFit:
        """The flags and environment of a launch on `target`: the general ones, plus each box
        setting whose conditions hold there. A setting whose condition the target does not
        tell is left out and named in `unknown`, never guessed."""
        flags, env = list(self.recommended_flags), dict(self.env)
        applied, other, unknown = [], [], []
        for bs in self.box_settings:
            holds, why = bs.verdict(target)
            line = f"{bs.words()} ({bs.condition()}: {bs.why}; {bs.source})"
            if holds:
                flags += bs.flags
                env.update(bs.env)
                applied.append(line)
            elif holds is False:
                other.append(f"not set: {bs.words()} ({bs.condition()}, {bs.keys()}): {why}")
            else:
                unknown.append(f"not set: {bs.words()} ({bs.condition()}, {bs.keys()}): {why}")
        return BoxFit(tuple(flags), env, tuple(applied), tuple(other), tuple(unknown))

    @property
    def is_reference(self) -> bool:
        """True for pcieprof's own reference server (not SGLang)."""
        return self.launch_module.startswith("pcieprof.")


@dataclass(frozen=True)
class ModelCard:
    """A served model: architecture numbers, storage costs, launch facts and their sources.

    Attributes:
        name: card name (`glm5-nvfp4`).
        description: one line.
        family: architecture family (`glm_moe_dsa`, `reference`).
        hf_checkpoints: Hugging Face repositories serving this card.
        total_params, active_params: parameters in total / active per token.
        num_layers, num_dense_layers, num_moe_layers: decoder layers (MTP layers not included).
        hidden_size: model width.
        dense_intermediate_size: FFN width of the dense layers.
        num_routed_experts, num_shared_experts, experts_per_token, moe_intermediate_size: MoE shape.
        attention: the attention shape.
        vocab_size: vocabulary.
        mtp_layers: multi-token-prediction (NextN) layers.
        max_context: maximum positions (tokens).
        weights: parameter groups by name.
        kv_cache: KV-cache cost.
        sglang: launch facts.
        sources: citation key -> URL.
        assumed: what is an estimate, by topic.
        search: the card's `[search]` table: the launch search's axes, claims and requirements
            (read by pcieprof.tune.space).
        decode_anchor: the card's `[decode_anchor]` table: a published decode curve of this
            checkpoint and the communication its box paid, which the layouts' compute is fitted
            to (read by pcieprof.analysis.anchors and pcieprof.tune.layout); {} when none.
        speculative: the card's `[speculative]` table: its MTP layer's SGLang flags and the gain
            as reported (read by pcieprof.tune.speculative); {} when none.
        path: the file the card came from.
    """

    name: str
    description: str
    family: str
    hf_checkpoints: tuple[str, ...]
    total_params: int
    active_params: int
    num_layers: int
    num_dense_layers: int
    num_moe_layers: int
    hidden_size: int
    dense_intermediate_size: int
    num_routed_experts: int
    num_shared_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    attention: AttentionSpec
    vocab_size: int
    mtp_layers: int
    max_context: int
    weights: dict[str, WeightGroup]
    kv_cache: KVCacheSpec
    sglang: LaunchFacts
    sources: dict[str, str] = field(default_factory=dict)
    assumed: dict[str, str] = field(default_factory=dict)
    base_checkpoint: str = ""
    tie_word_embeddings: bool = False
    search: dict[str, Any] = field(default_factory=dict)
    decode_anchor: dict[str, Any] = field(default_factory=dict)
    speculative: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    # -- derived quantities ----------------------------------------------------------------------

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weight groups together."""
        return sum(g.bytes for g in self.weights.values())

    def weight_bytes_per_gpu(self, tp: int, pp: int = 1) -> float:
        """Weight bytes per GPU when every group is split evenly over tp x pp GPUs (bytes).

        An even split is the ideal; replicated small tensors (norms, kv_a) make real figures a
        little higher.
        """
        if tp < 1 or pp < 1:
            raise BadInput(f"tp and pp must be >= 1 (got tp={tp}, pp={pp})")
        return self.weight_bytes / (tp * pp)

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token over all layers (one replica of the cache)."""
        return self.kv_cache.bytes_per_token_per_layer * self.num_layers

    def kv_bytes_per_token_per_gpu(self, tp: int, pp: int = 1) -> float:
        """KV-cache bytes one token costs on each GPU at this layout."""
        per_layer: float = self.kv_cache.bytes_per_token_per_layer
        if not self.kv_cache.replicated_across_tp:
            # Heads are split over the TP ranks, but a rank keeps at least one KV head: with
            # fewer KV heads than ranks (Qwen3-235B: 4 at TP8) SGLang replicates them.
            per_layer = per_layer / min(tp, self.attention.num_kv_heads or tp)
        return per_layer * self.num_layers / pp

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element: 4 when every weight group is fp32 (the reference
        server computes in fp32), else 2 (bf16, what SGLang all-reduces at decode)."""
        if self.weights and all(g.dtype == "fp32" for g in self.weights.values()):
            return 4
        return 2

    @property
    def content_hash(self) -> str:
        """sha256 of the card's content (every field but `path`), hex: two cards with the same
        hash describe the same model the same way, wherever they were read from."""
        data = asdict(self)
        data.pop("path", None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def short_hash(self) -> str:
        """The first 12 hex digits of `content_hash`, as shown to people."""
        return self.content_hash[:12]
