"""Model cards: the shipped files load, their numbers agree with each other and with the sources."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pcieprof.errors import BadInput
from pcieprof.cards import available_cards, load_card


def test_glm5_card_numbers_match_public_config() -> None:
    c = load_card("glm5-nvfp4")
    assert (c.num_layers, c.num_dense_layers, c.num_moe_layers) == (78, 3, 75)
    assert c.num_dense_layers + c.num_moe_layers == c.num_layers
    assert (c.hidden_size, c.vocab_size, c.mtp_layers) == (6144, 154880, 1)
    assert (c.num_routed_experts, c.num_shared_experts, c.experts_per_token) == (256, 1, 8)
    assert c.moe_intermediate_size == 2048
    a = c.attention
    assert a.type == "mla_dsa"
    assert (a.num_heads, a.q_lora_rank, a.kv_lora_rank, a.index_topk) == (64, 2048, 512, 2048)
    assert c.sglang.quantization == "modelopt_fp4" and c.sglang.kv_cache_dtype == "bf16"
    assert c.sglang.tp_default == 8
    assert set(c.hf_checkpoints) == {"nvidia/GLM-5-NVFP4", "lukealonso/GLM-5-NVFP4"}
    assert c.sources and c.assumed


def test_glm5_weight_groups_derive_from_the_shape() -> None:
    c = load_card("glm5-nvfp4")
    per_expert = 3 * c.hidden_size * c.moe_intermediate_size
    assert c.weights["routed_experts"].params == c.num_moe_layers * c.num_routed_experts * per_expert
    assert c.weights["shared_experts"].params == c.num_moe_layers * c.num_shared_experts * per_expert
    assert c.weights["embedding"].params == c.vocab_size * c.hidden_size
    # The groups add up to the published 744B total (within 0.5%) ...
    groups = sum(g.params for g in c.weights.values())
    assert abs(groups - c.total_params) / c.total_params < 0.005
    # ... and the active set (8 of 256 routed experts) to ~40B (within 10%, embeddings included).
    active = groups - c.weights["routed_experts"].params * (1 - c.experts_per_token / c.num_routed_experts)
    assert abs(active - c.active_params) / c.active_params < 0.1


def test_glm5_memory_fits_tp8_only() -> None:
    c = load_card("glm5-nvfp4")
    gb = 1e9
    # ~440 GB of NVFP4 weights; ~57 GB per GPU at TP8 (rtx6kpro glm5.md).
    assert 420 * gb < c.weight_bytes < 470 * gb
    assert 52 * gb < c.weight_bytes_per_gpu(tp=8) < 60 * gb
    assert c.weight_bytes_per_gpu(tp=4) > c.sglang.gpu_memory_gib * 2**30  # TP4 cannot hold it
    # KV: 314,304 tokens at TP8 are 29.32 GiB per GPU (MLA cache replicated on every rank).
    per_gpu = c.kv_bytes_per_token_per_gpu(tp=8) * 314_304 / 2**30
    assert math.isclose(per_gpu, 29.32, rel_tol=0.002)
    assert c.hidden_size * c.activation_bytes == 12288  # the decode all-reduce at batch 1


def test_tiny_cpu_card_is_the_reference_server() -> None:
    c = load_card("tiny-cpu")
    assert c.sglang.is_reference and c.sglang.launch_module == "pcieprof.refserver"
    assert c.sglang.backend == "cpu"
    assert c.total_params == sum(g.params for g in c.weights.values())
    assert 0 < c.active_params < c.total_params


def test_cards_listed_and_bad_names_refused(tmp_path: Path) -> None:
    assert {"glm5-nvfp4", "tiny-cpu"} <= set(available_cards())
    with pytest.raises(BadInput, match="unknown model card"):
        load_card("no-such-model")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\n")
    with pytest.raises(BadInput, match="bad model card"):
        load_card(bad)


def test_tiny_cpu_card_matches_the_reference_model() -> None:
    model = pytest.importorskip("pcieprof.refserver.model")
    cfg = model.TinyMoEConfig()
    c = load_card("tiny-cpu")
    assert (c.hidden_size, c.num_layers, c.num_dense_layers) == (cfg.hidden_size, cfg.num_layers,
                                                                 cfg.first_k_dense)
    assert c.num_moe_layers == cfg.num_layers - cfg.first_k_dense
    assert (c.num_routed_experts, c.experts_per_token) == (cfg.num_experts, cfg.experts_per_token)
    assert (c.moe_intermediate_size, c.num_shared_experts) == (cfg.moe_intermediate,
                                                               cfg.num_shared_experts)
    assert c.dense_intermediate_size == cfg.dense_intermediate
    assert (c.attention.num_heads, c.attention.head_dim) == (cfg.num_heads, cfg.head_dim)
    assert c.vocab_size == cfg.vocab_size
    assert c.weights["embedding"].params == cfg.padded_vocab_size * cfg.hidden_size
    moe = c.num_moe_layers * c.num_routed_experts * 3 * c.hidden_size * c.moe_intermediate_size
    assert c.weights["routed_experts"].params == moe
    assert c.kv_cache.bytes_per_token_per_layer == 2 * cfg.num_heads * cfg.head_dim * 4


def test_per_model_published_facts_live_in_the_card() -> None:
    """The compute anchor and the MTP table are the card file's own tables (no side file keyed
    by a card name): GLM-5 NVFP4 has both; a card made from a config.json with no card file of
    its checkpoint (the bf16 GLM-5 included: the anchor was measured on NVFP4) has neither."""
    from pcieprof.analysis.anchors import published_compute_ms
    from pcieprof.tune import speculative

    glm = load_card("glm5-nvfp4")
    assert glm.decode_anchor["points"][0] == [1, 51.5] and glm.decode_anchor["comm_ms"]
    assert speculative.facts(glm) == glm.speculative and glm.speculative["flags"]
    # published step at c=1 (1000/51.5 ms) less the published box's communication (7.30 ms)
    assert published_compute_ms("glm5-nvfp4", 1) == pytest.approx(1000 / 51.5 - 7.30)
    configs = Path(__file__).resolve().parents[1] / "data" / "cards"
    for arch in ("glm-5", "qwen3-235b-a22b", "gpt-oss-120b", "llama-3.1-70b"):
        card = load_card(configs / arch / "config.json")
        assert card.decode_anchor == {} and card.speculative == {}, arch
        assert speculative.facts(card) is None and published_compute_ms(card.name, 1) is None
