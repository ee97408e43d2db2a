"""Card files: a model card as a readable TOML file (pcieprof/cards/<name>.toml).

Every number in a card file carries its public source (`[sources]`); what could not be verified
is listed under `[assumed]`. glm5-nvfp4.toml shows every table a card file may hold.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pcieprof.cards.card import (
    NVLINK,
    PCIE,
    AttentionSpec,
    BoxSetting,
    KVCacheSpec,
    LaunchFacts,
    ModelCard,
    WeightGroup,
)
from pcieprof.errors import BadInput

#: The card files shipped with pcieprof.
CARDS_DIR = Path(__file__).parent


def available_cards() -> list[str]:
    """Names of the cards shipped with pcieprof."""
    return sorted(p.stem for p in CARDS_DIR.glob("*.toml"))


def shipped_cards() -> list[ModelCard]:
    """Every card shipped with pcieprof, loaded."""
    return [read_card_file(CARDS_DIR / f"{name}.toml") for name in available_cards()]


def card_to_dict(card: ModelCard) -> dict[str, Any]:
    """A card as the data of a card file (the tables of glm5-nvfp4.toml), for a bundle to keep:
    `card_from_dict(card_to_dict(c), p).content_hash == c.content_hash`."""
    d = asdict(card)
    d.pop("path", None)
    launch = d.pop("sglang")
    startup = {k: launch.pop(k) for k in ("startup_timeout_s", "stall_timeout_s",
                                          "probe_timeout_s")}
    d["sglang"] = {**launch, "startup": startup}
    return d


def card_from_dict(data: dict[str, Any], path: Path) -> ModelCard:
    """A card from the data of a card file (read from `path`).

    Raises:
        BadInput: data missing required fields or of the wrong type.
    """
    try:
        return _from_dict(data, path)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadInput(f"{path}: bad model card ({type(exc).__name__}: {exc})") from None


def read_card_file(path: Path) -> ModelCard:
    """A card from its TOML file.

    Raises:
        BadInput: an unreadable file or a card missing required fields.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{path}: unreadable model card ({exc})") from None
    return card_from_dict(data, path)


def launch_facts(s: dict[str, Any]) -> LaunchFacts:
    """A card file's `[sglang]` table as LaunchFacts."""
    s = dict(s)
    env = {str(k): str(v) for k, v in s.pop("env", {}).items()}
    box = tuple(BoxSetting(flags=tuple(str(x) for x in b.get("flags", [])),
                           env={str(k): str(v) for k, v in b.get("env", {}).items()},
                           arch=tuple(str(a) for a in b.get("arch", [])),
                           fabric=_fabric(b.get("fabric", "")), why=str(b.get("why", "")),
                           source=str(b.get("source", "")))
                for b in s.pop("box_settings", []))
    start = dict(s.pop("startup", {}))
    return LaunchFacts(
        launch_module=str(s["launch_module"]), model_path=str(s.get("model_path", "")),
        quantization=str(s.get("quantization", "")), kv_cache_dtype=str(s.get("kv_cache_dtype", "")),
        tp_default=int(s.get("tp_default", 1)),
        # `gpu_memory_gb`: the key's name in cards written before it said its unit (always GiB)
        gpu_memory_gib=float(s.get("gpu_memory_gib", s.get("gpu_memory_gb", 0))),
        gpu_memory_nvml_mib=float(s.get("gpu_memory_nvml_mib", 0)),
        attention_backend=str(s.get("attention_backend", "")),
        recommended_flags=tuple(str(x) for x in s.get("recommended_flags", [])),
        env=env, box_settings=box, fabric=_fabric(s.get("fabric", "")),
        backend=str(s.get("backend", "cuda")),
        startup_timeout_s=float(start.get("startup_timeout_s", 1800.0)),
        stall_timeout_s=float(start.get("stall_timeout_s", 300.0)),
        probe_timeout_s=float(start.get("probe_timeout_s", 300.0)))


def _fabric(value: object) -> str:
    """A card's `fabric` value, checked (`pcie`, `nvlink` or "")."""
    text = str(value)
    if text not in ("", PCIE, NVLINK):
        raise ValueError(f"fabric {text!r} is not one of {PCIE!r}, {NVLINK!r}")
    return text


def _from_dict(d: dict[str, Any], path: Path) -> ModelCard:
    weights = {k: WeightGroup(params=int(v["params"]), dtype=str(v["dtype"]),
                              bytes_per_param=float(v["bytes_per_param"]))
               for k, v in d.get("weights", {}).items()}
    launch = launch_facts(d["sglang"])
    att = dict(d["attention"])
    attention = AttentionSpec(**att)
    kv = d["kv_cache"]
    total = int(d.get("total_params", 0)) or sum(g.params for g in weights.values())
    active = int(d.get("active_params", 0)) or _active_from_groups(d, weights)
    return ModelCard(
        name=str(d["name"]), description=str(d.get("description", "")),
        family=str(d.get("family", "")), hf_checkpoints=tuple(d.get("hf_checkpoints", [])),
        total_params=total, active_params=active,
        num_layers=int(d["num_layers"]), num_dense_layers=int(d["num_dense_layers"]),
        num_moe_layers=int(d["num_moe_layers"]), hidden_size=int(d["hidden_size"]),
        dense_intermediate_size=int(d.get("dense_intermediate_size", 0)),
        num_routed_experts=int(d["num_routed_experts"]),
        num_shared_experts=int(d["num_shared_experts"]),
        experts_per_token=int(d["experts_per_token"]),
        moe_intermediate_size=int(d["moe_intermediate_size"]), attention=attention,
        vocab_size=int(d["vocab_size"]), mtp_layers=int(d.get("mtp_layers", 0)),
        max_context=int(d.get("max_context", 0)), weights=weights,
        kv_cache=KVCacheSpec(dtype=str(kv["dtype"]),
                             bytes_per_token_per_layer=int(kv["bytes_per_token_per_layer"]),
                             replicated_across_tp=bool(kv.get("replicated_across_tp", False))),
        sglang=launch, sources=dict(d.get("sources", {})), assumed=dict(d.get("assumed", {})),
        base_checkpoint=str(d.get("base_checkpoint", "")),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        search=dict(d.get("search", {})), decode_anchor=dict(d.get("decode_anchor", {})),
        speculative=dict(d.get("speculative", {})), path=path)


def _active_from_groups(d: dict[str, Any], weights: dict[str, WeightGroup]) -> int:
    """Active parameters when a card does not state them: routed experts count k/E."""
    n_e = int(d["num_routed_experts"]) or 1
    k = int(d["experts_per_token"])
    total = 0.0
    for name, g in weights.items():
        total += g.params * (k / n_e if name == "routed_experts" else 1.0)
    return int(total)
