"""Cards from Hugging Face config.json files: four architectures against their published numbers
(tests/data/cards/NOTE.md gives each config's source), the local cache, and the card file that
supplies what a config lacks."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from pcieprof.cards import load_card
from pcieprof.errors import BadInput

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "cards"


def config(name: str) -> Path:
    return CONFIGS / name / "config.json"


def test_glm5_mla_moe_from_its_config() -> None:
    c = load_card(config("glm-5"))
    assert (c.num_layers, c.num_dense_layers, c.num_moe_layers, c.mtp_layers) == (78, 3, 75, 1)
    assert (c.num_routed_experts, c.num_shared_experts, c.experts_per_token) == (256, 1, 8)
    a = c.attention
    assert (a.type, a.num_heads, a.q_lora_rank, a.kv_lora_rank, a.index_topk) == (
        "mla_dsa", 64, 2048, 512, 2048)
    # 744B total, 40B active (GLM-5 technical report); the active count includes embeddings.
    assert math.isclose(c.total_params, 744e9, rel_tol=0.005)
    assert math.isclose(c.active_params, 40e9, rel_tol=0.06)
    # MLA latent (512 + 64) x bf16 + the DSA indexer key (128 B FP8 + 4 B scale), on every rank.
    assert c.kv_cache.bytes_per_token_per_layer == 1284 and c.kv_cache.replicated_across_tp
    assert "indexer_kv_bytes" in c.assumed and "kv_cache_dtype" in c.assumed


def test_qwen3_moe_from_its_config() -> None:
    c = load_card(config("qwen3-235b-a22b"))
    assert (c.num_layers, c.num_dense_layers, c.num_moe_layers) == (94, 0, 94)
    assert (c.num_routed_experts, c.experts_per_token, c.moe_intermediate_size) == (128, 8, 1536)
    assert (c.attention.type, c.attention.num_kv_heads, c.attention.head_dim) == ("gqa", 4, 128)
    assert math.isclose(c.total_params, 235e9, rel_tol=0.005)  # 235B total, 22B active
    assert math.isclose(c.active_params, 22e9, rel_tol=0.02)
    assert c.kv_cache.bytes_per_token_per_layer == 2 * 4 * 128 * 2
    # 4 KV heads at TP8: every rank keeps one head, not half of one.
    assert c.kv_bytes_per_token_per_gpu(tp=8) == c.kv_bytes_per_token_per_gpu(tp=4)


def test_gpt_oss_mxfp4_from_its_config() -> None:
    c = load_card(config("gpt-oss-120b"))
    assert (c.num_layers, c.num_moe_layers, c.num_routed_experts, c.experts_per_token) == (
        36, 36, 128, 4)
    assert (c.attention.num_heads, c.attention.num_kv_heads, c.attention.head_dim) == (64, 8, 64)
    # 116.83B total, 5.13B active without the embedding (gpt-oss model card, arXiv 2508.10925).
    assert math.isclose(c.total_params, 116.83e9, rel_tol=0.002)
    active = c.active_params - c.weights["embedding"].params
    assert math.isclose(active, 5.13e9, rel_tol=0.01)
    # MXFP4 experts (4 bit + an E8M0 scale per 32), attention/router/embeddings bf16: the
    # published checkpoint is ~65 GB.
    assert c.weights["routed_experts"].dtype == "mxfp4"
    assert c.weights["attention"].dtype == c.weights["lm_head"].dtype == "bf16"
    assert 60e9 < c.weight_bytes < 70e9
    assert "sliding_window_layers" in c.assumed


def test_dense_llama_from_its_config() -> None:
    c = load_card(config("llama-3.1-70b"))
    assert (c.num_layers, c.num_dense_layers, c.num_moe_layers, c.num_routed_experts) == (
        80, 80, 0, 0)
    assert c.dense_intermediate_size == 28672 and c.attention.num_kv_heads == 8
    # 70,553,706,496 parameters in the checkpoint; the norms (1.3M) are not counted.
    assert math.isclose(c.total_params, 70_553_706_496, rel_tol=1e-4)
    assert c.active_params == c.total_params
    assert c.kv_bytes_per_token() == 327_680  # 80 layers x 2 x 8 heads x 128 x bf16


def test_a_checkpoint_directory_and_the_local_cache(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    by_dir = load_card(config("llama-3.1-70b").parent)
    assert by_dir.content_hash == load_card(config("llama-3.1-70b")).content_hash
    cache = tmp_path / "hub"
    snap = cache / "models--Qwen--Qwen3-235B-A22B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(config("qwen3-235b-a22b"), snap / "config.json")
    (cache / "models--Qwen--Qwen3-235B-A22B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen3-235B-A22B" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    c = load_card("Qwen/Qwen3-235B-A22B")
    assert c.name == "Qwen3-235B-A22B" and c.hf_checkpoints == ("Qwen/Qwen3-235B-A22B",)
    assert c.sglang.model_path == "Qwen/Qwen3-235B-A22B"
    with pytest.raises(BadInput, match="unknown model card 'Qwen/Qwen3-8B'"):
        load_card("Qwen/Qwen3-8B")  # not in the cache: nothing is downloaded


def test_the_card_file_supplies_what_the_config_lacks(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A config cached as one of glm5-nvfp4's checkpoints takes that card's weight formats, KV
    dtype, launch facts and search table; the architecture is the config's."""
    snap = tmp_path / "hub" / "models--nvidia--GLM-5-NVFP4" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    shutil.copy(config("glm-5"), snap / "config.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    c, card_file = load_card("nvidia/GLM-5-NVFP4"), load_card("glm5-nvfp4")
    assert c.name == "glm5-nvfp4" and c.search == card_file.search
    # the checkpoint's published decode curve and MTP facts come with its card file
    assert c.decode_anchor == card_file.decode_anchor and c.decode_anchor["tp"] == 8
    assert c.speculative == card_file.speculative and c.speculative["algorithm"] == "NEXTN"
    assert c.sglang == card_file.sglang and c.kv_cache == card_file.kv_cache
    assert c.weights["routed_experts"].dtype == "nvfp4"
    assert "sglang" not in c.assumed and "config" in c.sources
    assert math.isclose(c.weight_bytes, card_file.weight_bytes, rel_tol=0.001)


def test_the_glm5_card_file_agrees_with_the_published_config() -> None:
    """glm5-nvfp4.toml's architecture is GLM-5's config.json, group by group."""
    f, c = load_card("glm5-nvfp4"), load_card(config("glm-5"))
    for key in ("num_layers", "num_dense_layers", "num_moe_layers", "hidden_size",
                "dense_intermediate_size", "num_routed_experts", "num_shared_experts",
                "experts_per_token", "moe_intermediate_size", "vocab_size", "mtp_layers",
                "max_context", "attention"):
        assert getattr(f, key) == getattr(c, key), key
    assert {g: w.params for g, w in f.weights.items()} == {g: w.params for g, w in c.weights.items()}
    assert f.kv_cache.bytes_per_token_per_layer == c.kv_cache.bytes_per_token_per_layer


def test_bad_configs_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(BadInput, match="unreadable config.json"):
        load_card(bad)
    bad.write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(BadInput, match="not a config.json pcieprof can read"):
        load_card(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(BadInput, match="holds a JSON object"):
        load_card(tmp_path)


def test_two_configs_two_hashes() -> None:
    a, b = load_card(config("qwen3-235b-a22b")), load_card(config("llama-3.1-70b"))
    assert a.content_hash != b.content_hash and len(a.content_hash) == 64
    assert load_card("glm5-nvfp4").content_hash == load_card("glm5-nvfp4").content_hash


def test_a_card_kept_as_data_is_the_same_card(tmp_path: Path) -> None:
    """What a bundle keeps (model_card.json) reads back as the same card, hash and all."""
    from pcieprof.cards.toml_file import card_from_dict, card_to_dict

    for ref in ("glm5-nvfp4", "tiny-cpu", str(config("gpt-oss-120b")), str(config("glm-5"))):
        card = load_card(ref)
        data = json.loads(json.dumps(card_to_dict(card)))
        back = card_from_dict(data, tmp_path / "model_card.json")
        assert back.content_hash == card.content_hash, ref
        assert back.kv_bytes_per_token() == card.kv_bytes_per_token()


def test_a_local_nvfp4_checkpoint_finds_its_card_file(tmp_path: Path) -> None:
    """A GLM-5 config.json outside the cache whose quantization_config is ModelOpt's NVFP4
    (quant_method modelopt, quant_algo NVFP4) is glm5-nvfp4's checkpoint: same model type and
    shape, same quantization; the bf16 base config is not."""
    cfg = json.loads(config("glm-5").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    (tmp_path / "GLM-5-NVFP4").mkdir()
    (tmp_path / "GLM-5-NVFP4" / "config.json").write_text(json.dumps(cfg))
    c = load_card(tmp_path / "GLM-5-NVFP4")
    assert c.name == "glm5-nvfp4" and c.sglang.quantization == "modelopt_fp4"
    assert load_card(config("glm-5")).name == "glm-5"  # bf16: no card file, assumed facts
