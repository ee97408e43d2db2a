"""A card from a model's own Hugging Face `config.json`, read offline (a path or the local cache).

The config gives the architecture: layers (dense and MoE), hidden size, heads, the KV layout (MLA
or GQA), experts and experts per token, MTP layers, vocabulary, context and the checkpoint's
dtype and quantization. The key names are those of the transformers configuration classes
(DeepseekV3Config, GlmMoeDsaConfig, Qwen3MoeConfig, GptOssConfig, LlamaConfig); one reader takes
them all, by the keys a config has rather than by its model_type.

What a config lacks comes from a shipped card file for the same checkpoint when there is one
(pcieprof/cards/*.toml: the weight format of each parameter group, the KV-cache dtype, the
SGLang launch facts and search table), else it is assumed and said so in `card.assumed`:
weights in the config's quantization (or dtype), KV cache in the checkpoint dtype (SGLang's
`--kv-cache-dtype auto`), SGLang's own defaults for the launch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pcieprof.cards.card import (
    AttentionSpec,
    KVCacheSpec,
    LaunchFacts,
    ModelCard,
    WeightGroup,
)
from pcieprof.errors import BadInput

#: Bytes per element of the checkpoint dtypes a config names (`torch_dtype`, or `dtype` in
#: transformers >= 4.56).
DTYPE_BYTES = {"bfloat16": ("bf16", 2.0), "float16": ("fp16", 2.0), "float32": ("fp32", 4.0)}

#: Bytes per parameter of the quantized formats a config's `quantization_config` names, scales
#: included:
#: - MXFP4: 4-bit E2M1 elements, one 8-bit E8M0 scale per block of 32 (OCP Microscaling Formats
#:   (MX) v1.0, https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf);
#:   gpt-oss's MoE weights (https://huggingface.co/openai/gpt-oss-120b: "native MXFP4
#:   quantization ... for the MoE layer").
#: - NVFP4: 4-bit E2M1, one FP8 E4M3 scale per 16 (https://huggingface.co/lukealonso/GLM-5-NVFP4).
#: - FP8 with `weight_block_size` [a, b]: 1 byte plus one fp32 scale per a x b block
#:   (DeepSeek-V3's config: quant_method fp8, weight_block_size [128, 128]).
MXFP4_BYTES = 0.5 + 1 / 32
NVFP4_BYTES = 0.5 + 1 / 16

#: Parameter groups a weight-only quantization may cover; embeddings, LM head and router stay in
#: the checkpoint dtype in every format above (gpt-oss lists them in modules_to_not_convert).
LINEAR_GROUPS = ("attention", "routed_experts", "shared_experts", "dense_mlp")

#: The words of a `modules_to_not_convert` / `ignore` / `exclude_modules` pattern that name a group.
_EXCLUDE_WORDS = {"attention": ("self_attn", "attn"), "shared_experts": ("shared_expert",)}


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub finds it: HF_HUB_CACHE, else
    HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def cached_config(repo_id: str) -> Path | None:
    """config.json of `repo_id` (`Qwen/Qwen3-235B-A22B`) in the local hub cache, or None.

    The snapshot is the one refs/main names; without that ref, the most recently written one.
    Nothing is downloaded.
    """
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    try:
        if ref.is_file():
            snap = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
            return snap / "config.json" if (snap / "config.json").is_file() else None
        snaps = [p for p in (repo / "snapshots").glob("*/config.json") if p.is_file()]
    except OSError:
        return None
    return max(snaps, key=lambda p: p.stat().st_mtime) if snaps else None


def repo_of(path: Path) -> str:
    """The repository id a cached config.json belongs to (.../models--org--name/snapshots/REV/
    config.json -> org/name), or "" for a config elsewhere."""
    for part in reversed(path.resolve().parts):
        if part.startswith("models--"):
            return part[len("models--"):].replace("--", "/", 1)
    return ""


def read_config(path: Path) -> dict[str, Any]:
    """The JSON object of a config.json.

    Raises:
        BadInput: unreadable, not JSON, or not an object.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"{path}: unreadable config.json ({exc})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a config.json holds a JSON object, got {type(data).__name__}")
    # Multimodal checkpoints keep the language model's keys under text_config.
    text = data.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in data:
        return {**data, **text}
    return data


def card_from_config(path: Path, shipped: list[ModelCard]) -> ModelCard:
    """The card of the checkpoint whose config.json is at `path`.

    Args:
        path: a config.json file.
        shipped: the card files to take what the config lacks from (the first for the same
            checkpoint, see `matching_card`).

    Raises:
        BadInput: an unreadable config, or one without the keys of a decoder-only transformer.
    """
    path = path.resolve()  # the same config read by two paths is the same card (its hash)
    cfg = read_config(path)
    repo = repo_of(path) or _name_or_path(cfg)
    try:
        arch = _Architecture(cfg)
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"{path}: not a config.json pcieprof can read ({type(exc).__name__}: {exc})",
                       hint="a decoder-only transformer's config (num_hidden_layers, hidden_size, "
                            "num_attention_heads, vocab_size)") from None
    base = matching_card(cfg, repo, shipped)
    return arch.card(path, repo, base)


def matching_card(cfg: dict[str, Any], repo: str, shipped: list[ModelCard]) -> ModelCard | None:
    """The shipped card file for this config's checkpoint: one that lists `repo` among its
    hf_checkpoints, else one of the same model type and shape (hidden size, layers, vocabulary)
    whose launch quantization is the config's."""
    for card in shipped:
        if repo and repo in card.hf_checkpoints:
            return card
    quant = _quant_method(cfg)
    for card in shipped:
        if (card.family == cfg.get("model_type") and card.hidden_size == cfg.get("hidden_size")
                and card.num_layers == cfg.get("num_hidden_layers")
                and card.vocab_size == cfg.get("vocab_size")
                and _same_quantization(card.sglang.quantization, quant)):
            return card
    return None


def _name_or_path(cfg: dict[str, Any]) -> str:
    v = cfg.get("_name_or_path")
    return v if isinstance(v, str) and v.count("/") == 1 and not v.startswith((".", "/")) else ""


def _quant_method(cfg: dict[str, Any]) -> str:
    """`fp8`, `mxfp4`, `nvfp4`, another method's own name, or "" when the weights are not
    quantized."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return ""
    method = str(q.get("quant_method", "")).lower()
    if method == "modelopt":
        return str(q.get("quant_algo", "")).lower() or "modelopt"
    return method


def _same_quantization(card_flag: str, config_method: str) -> bool:
    """A card's SGLang --quantization value and a config's method name the same format."""
    if not card_flag:
        return config_method == ""
    return config_method in {"modelopt_fp4": ("nvfp4",), "fp8": ("fp8",),
                             "mxfp4": ("mxfp4",)}.get(card_flag, (card_flag,))


class _Architecture:
    """The numbers of a config.json, read once (KeyError when a required key is missing)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.model_type = str(cfg.get("model_type", ""))
        self.layers = int(cfg["num_hidden_layers"])
        self.hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.kv_heads = int(cfg.get("num_key_value_heads") or self.heads)
        self.vocab = int(cfg["vocab_size"])
        self.experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts")
                           or cfg.get("num_local_experts") or 0)
        self.top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)
        # gpt-oss and Mixtral give the experts' width as intermediate_size; DeepSeek-style and
        # Qwen MoE configs give moe_intermediate_size and keep intermediate_size for dense layers.
        self.dense_inter = int(cfg.get("intermediate_size") or 0)
        self.moe_inter = int(cfg.get("moe_intermediate_size") or self.dense_inter)
        self.moe = self._moe_layers()
        self.mtp = int(cfg.get("num_nextn_predict_layers") or 0)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.mla = bool(cfg.get("kv_lora_rank"))
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "")
        self.dtype_known = dtype in DTYPE_BYTES
        self.dtype, self.dtype_bytes = DTYPE_BYTES.get(dtype, ("bf16", 2.0))

    def _moe_layers(self) -> list[bool]:
        """Which decoder layers have a MoE block, by the rule of the config's model code."""
        c, n = self.cfg, self.layers
        if not self.experts:
            return [False] * n
        if isinstance(c.get("mlp_layer_types"), list):  # GlmMoeDsaConfig
            return [t == "sparse" for t in c["mlp_layer_types"]][:n]
        if "first_k_dense_replace" in c:  # DeepseekV3: i >= k and i % moe_layer_freq == 0
            k, freq = int(c["first_k_dense_replace"]), int(c.get("moe_layer_freq") or 1)
            return [i >= k and i % freq == 0 for i in range(n)]
        if "decoder_sparse_step" in c or "mlp_only_layers" in c:  # Qwen2/3 MoE
            step, dense = int(c.get("decoder_sparse_step") or 1), set(c.get("mlp_only_layers") or [])
            return [i not in dense and (i + 1) % step == 0 for i in range(n)]
        return [True] * n  # gpt-oss, Mixtral: every layer routes

    # -- parameter groups ----------------------------------------------------------------------

    def attention(self) -> tuple[AttentionSpec, int, list[str]]:
        """The attention shape, its parameters per layer, and what about it is assumed."""
        c, h, nh = self.cfg, self.hidden, self.heads
        if not self.mla:
            hd = int(c.get("head_dim") or h // nh)
            spec = AttentionSpec(type="gqa" if self.kv_heads < nh else "mha", num_heads=nh,
                                 num_kv_heads=self.kv_heads, head_dim=hd)
            return spec, 2 * h * nh * hd + 2 * h * self.kv_heads * hd, []
        q_lora = int(c.get("q_lora_rank") or 0)
        kv_lora, rope = int(c["kv_lora_rank"]), int(c["qk_rope_head_dim"])
        nope, v = int(c["qk_nope_head_dim"]), int(c["v_head_dim"])
        q = (h * q_lora + q_lora * nh * (nope + rope)) if q_lora else h * nh * (nope + rope)
        params = q + h * (kv_lora + rope) + kv_lora * nh * (nope + v) + nh * v * h
        notes: list[str] = []
        topk = int(c.get("index_topk") or 0)
        ih, idim = int(c.get("index_n_heads") or 0), int(c.get("index_head_dim") or 0)
        if topk:
            # DeepSeek-V3.2's indexer: wq_b (q_lora x heads x dim), wk (hidden x dim),
            # weights_proj (hidden x heads); the config gives the sizes, not the layout.
            params += (q_lora or h) * ih * idim + h * idim + h * ih
            notes.append("dsa_indexer_shape: indexer weights wq_b, wk, weights_proj in "
                         "DeepSeek-V3.2's layout")
        spec = AttentionSpec(type="mla_dsa" if topk else "mla", num_heads=nh,
                             num_kv_heads=self.kv_heads, q_lora_rank=q_lora or None,
                             kv_lora_rank=kv_lora, qk_rope_head_dim=rope,
                             qk_nope_head_dim=nope, v_head_dim=v, index_topk=topk or None,
                             index_n_heads=ih or None, index_head_dim=idim or None)
        return spec, params, notes

    def shared_params_per_layer(self) -> tuple[int, int]:
        """Shared experts per MoE layer and their parameters (DeepSeek: n_shared_experts of the
        routed experts' width; Qwen2-MoE: one of shared_expert_intermediate_size)."""
        c = self.cfg
        if c.get("shared_expert_intermediate_size"):
            return 1, 3 * self.hidden * int(c["shared_expert_intermediate_size"])
        n = int(c.get("n_shared_experts") or 0)
        return n, n * 3 * self.hidden * self.moe_inter

    def param_groups(self) -> tuple[dict[str, int], AttentionSpec, list[str]]:
        n_moe = sum(self.moe)
        n_dense = self.layers - n_moe
        spec, attn, notes = self.attention()
        _, shared = self.shared_params_per_layer()
        groups = {
            "attention": self.layers * attn,
            "routed_experts": n_moe * self.experts * 3 * self.hidden * self.moe_inter,
            "shared_experts": n_moe * shared,
            "dense_mlp": n_dense * 3 * self.hidden * self.dense_inter,
            "router": n_moe * self.experts * self.hidden,
            "embedding": self.vocab * self.hidden,
            "lm_head": 0 if self.tied else self.vocab * self.hidden,
        }
        return {k: v for k, v in groups.items() if v}, spec, notes

    # -- formats -------------------------------------------------------------------------------

    def weight_formats(self, groups: dict[str, int]) -> tuple[dict[str, tuple[str, float]], str]:
        """dtype and bytes per parameter of each group from the config alone, and what is
        assumed about them ("" when nothing)."""
        out = {g: (self.dtype, self.dtype_bytes) for g in groups}
        assumed = "" if self.dtype_known else f"checkpoint dtype not in the config: {self.dtype}"
        q = self.cfg.get("quantization_config")
        method = _quant_method(self.cfg)
        if not method or not isinstance(q, dict):
            return out, assumed
        fmt: tuple[str, float] | None = None
        if method == "mxfp4":
            fmt = ("mxfp4", MXFP4_BYTES)
        elif method == "nvfp4":
            fmt = ("nvfp4", NVFP4_BYTES)
        elif method == "fp8":
            block = q.get("weight_block_size") or [0, 0]
            area = int(block[0]) * int(block[1]) if len(block) == 2 else 0
            fmt = ("fp8", 1.0 + (4.0 / area if area else 0.0))
        elif isinstance(q.get("bits"), (int, float)):
            fmt = (f"int{int(q['bits'])}", float(q["bits"]) / 8)
            assumed = f"{method}: {q['bits']} bits per weight, group scales not counted"
        if fmt is None:
            return out, (f"quantization {method!r} not read: weights counted at the checkpoint "
                         f"dtype ({self.dtype}), an upper bound")
        excluded = [str(p) for k in ("modules_to_not_convert", "ignore", "exclude_modules")
                    for p in (q.get(k) or [])]
        for g in LINEAR_GROUPS:
            words = _EXCLUDE_WORDS.get(g, ())
            if g in out and not any(w in p for p in excluded for w in words):
                out[g] = fmt
        note = (f"{method}: the attention and MLP/expert projections quantized unless the "
                f"config excludes them; embedding, lm_head and router at {self.dtype}")
        return out, f"{assumed}; {note}" if assumed else note

    def kv_bytes_per_token_per_layer(self, kv_bytes: float) -> tuple[int, bool, list[str]]:
        """KV-cache bytes of one token in one layer, whether every TP rank holds all of it, and
        what is assumed."""
        c = self.cfg
        if self.mla:
            latent = (int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"])) * kv_bytes
            notes = []
            if c.get("index_topk"):
                # The DSA indexer keeps one FP8 key of index_head_dim and a 4-byte scale per
                # token (SGLang's NSA layout; glm5-nvfp4.toml's [assumed] indexer_kv_bytes).
                latent += int(c.get("index_head_dim") or 0) + 4
                notes.append("indexer_kv_bytes: DSA indexer key = index_head_dim x FP8 + 4-byte "
                             "scale per token per layer")
            return int(latent), True, notes
        hd = int(c.get("head_dim") or self.hidden // self.heads)
        notes = []
        if "sliding_attention" in (c.get("layer_types") or []):
            notes.append("sliding_window_layers: sliding-window layers counted as full attention "
                         "(an upper bound on the KV cache)")
        return int(2 * self.kv_heads * hd * kv_bytes), False, notes

    # -- the card ------------------------------------------------------------------------------

    def card(self, path: Path, repo: str, base: ModelCard | None) -> ModelCard:
        groups, attention, notes = self.param_groups()
        formats, weight_note = self.weight_formats(groups)
        assumed: dict[str, str] = {}
        if base is not None:
            assumed.update(base.assumed)
            for g in groups:  # the card file's format of each group, with its sources
                if g in base.weights:
                    formats[g] = (base.weights[g].dtype, base.weights[g].bytes_per_param)
            missing = [g for g in groups if g not in base.weights]
            if missing:
                assumed["weights"] = (f"{', '.join(missing)}: not in card {base.name}; "
                                      f"{weight_note or 'the config dtype'}")
        elif weight_note:
            assumed["weights"] = weight_note
        weights = {g: WeightGroup(params=p, dtype=formats[g][0], bytes_per_param=formats[g][1])
                   for g, p in groups.items()}
        if base is not None and base.kv_cache.dtype:
            kv_dtype = base.kv_cache.dtype
            kv_bytes = {"fp32": 4.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8": 1.0}.get(kv_dtype, 2.0)
        else:
            kv_dtype, kv_bytes = self.dtype, self.dtype_bytes
            assumed["kv_cache_dtype"] = (f"KV cache in the checkpoint dtype ({self.dtype}), "
                                         "SGLang's --kv-cache-dtype auto")
        kv_per_layer, replicated, kv_notes = self.kv_bytes_per_token_per_layer(kv_bytes)
        for n in notes + kv_notes:
            key, _, text = n.partition(": ")
            assumed.setdefault(key, text)
        routed = groups.get("routed_experts", 0)
        total = sum(groups.values())
        active = total - (routed - routed * self.top_k // self.experts if self.experts else 0)
        n_moe = sum(self.moe)
        shared_n, _ = self.shared_params_per_layer()
        where = repo or path.parent.name
        sources = dict(base.sources) if base is not None else {}
        sources["config"] = f"{where}/config.json (the checkpoint's Hugging Face config)"
        launch = base.sglang if base is not None else LaunchFacts(
            launch_module="sglang.launch_server", model_path=repo or str(path.parent))
        if base is None:
            assumed["sglang"] = "no card file for this checkpoint: SGLang's defaults, TP 1"
            assumed["search"] = "no card file: no launch-search table (SGLang's own backends)"
        name = base.name if base is not None else (repo.rsplit("/", 1)[-1] if repo
                                                   else path.resolve().parent.name)
        return ModelCard(
            name=name,
            description=(base.description if base is not None
                         else f"{where}: {self.model_type or 'transformer'} from its config.json"),
            family=self.model_type, hf_checkpoints=base.hf_checkpoints if base else
            ((repo,) if repo else ()), total_params=total, active_params=active,
            num_layers=self.layers, num_dense_layers=self.layers - n_moe, num_moe_layers=n_moe,
            hidden_size=self.hidden, dense_intermediate_size=self.dense_inter if
            self.layers - n_moe else 0, num_routed_experts=self.experts,
            num_shared_experts=shared_n, experts_per_token=self.top_k,
            moe_intermediate_size=self.moe_inter if self.experts else 0, attention=attention,
            vocab_size=self.vocab, mtp_layers=self.mtp,
            max_context=int(self.cfg.get("max_position_embeddings") or 0), weights=weights,
            kv_cache=KVCacheSpec(dtype=kv_dtype, bytes_per_token_per_layer=kv_per_layer,
                                 replicated_across_tp=replicated),
            sglang=launch, sources=sources, assumed=assumed,
            base_checkpoint=base.base_checkpoint if base is not None else "",
            tie_word_embeddings=self.tied, search=dict(base.search) if base is not None else {},
            # the card file of this checkpoint: its published decode curve and MTP facts hold
            decode_anchor=dict(base.decode_anchor) if base is not None else {},
            speculative=dict(base.speculative) if base is not None else {},
            path=path)

