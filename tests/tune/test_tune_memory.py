"""GPU memory per layout as SGLang lays GLM-5 out: replicated parts on every GPU, DP attention,
KV per request, and the fit verdict in GiB."""

from __future__ import annotations

import pytest

from pcieprof.analysis.box import GIB, Box
from pcieprof.cards import load_card
from pcieprof.tune import memory as M


@pytest.fixture(scope="module")
def card():  # type: ignore[no-untyped-def]
    return load_card("glm5-nvfp4")


def test_published_figures_are_gib(card) -> None:  # type: ignore[no-untyped-def]
    # rtx6kpro models/glm5.md [S6]: "KV cache 29.32 GB" for 314,304 tokens per GPU. The card's
    # bytes per token give 29.32 only in GiB (31.5 in 1e9 bytes): S6's "GB" is GiB, and so is
    # its "~57 GB of weights per GPU" at TP8 (with the MTP layer, ~2 GiB per GPU more).
    kv = card.kv_bytes_per_token_per_gpu(8) * 314_304
    assert kv / GIB == pytest.approx(29.32, abs=0.01)
    assert kv / 1e9 == pytest.approx(31.5, abs=0.1)
    tp8 = M.weights_per_gpu(card, M.Placement(tp=8))
    assert 54 < tp8 / GIB < 57


def test_replicated_parts_are_on_every_gpu(card) -> None:  # type: ignore[no-untyped-def]
    rep = M.replicated_attention_bytes(card)
    # fused q_a/kv_a (6144 x 2624) + indexer (2048 x 4096 + 6144 x 160) per layer, 78 layers, BF16
    assert rep == 78 * 2 * (6144 * 2624 + 2048 * 4096 + 6144 * 160)
    even = card.weight_bytes / 8
    assert M.weights_per_gpu(card, M.Placement(tp=8)) > even + 0.8 * rep


def test_dp_attention_copies_the_attention_weights(card) -> None:  # type: ignore[no-untyped-def]
    tp8 = M.weights_per_gpu(card, M.Placement(tp=8))
    dpa = M.weights_per_gpu(card, M.Placement(tp=8, dp_attention=8))
    attn = card.weights["attention"].bytes
    assert dpa - tp8 > 0.8 * attn * 7 / 8
    box = Box(gpus=8, arch="sm120", memory_bytes=95.59 * GIB, memory_source="test")
    f = M.fit(card, M.Placement(tp=8, dp_attention=8), box, 8192)
    # each GPU holds its own requests' KV: ~7 of 8K tokens, ~56 for the box, not 64
    assert 5 <= f.requests_per_gpu <= 8


def test_a_model_that_does_not_fit_says_so_in_gib(card) -> None:  # type: ignore[no-untyped-def]
    box = Box(gpus=2, arch="sm89", memory_bytes=24 * GIB, memory_source="test")
    f = M.fit(card, M.Placement(tp=M.widest_tp(card, 2)), box, 8192)
    assert f.fits is False
    assert f.verdict().startswith("does not fit this box (needs 210.")
    assert "has 20.4 = 24.0 GiB x --mem-fraction-static 0.85" in f.verdict()
    unknown = M.fit(card, M.Placement(tp=8), Box(gpus=8), 8192)
    assert unknown.fits is None and unknown.verdict().startswith("fit not checked")


def test_widest_tp_divides_the_heads(card) -> None:  # type: ignore[no-untyped-def]
    assert [M.widest_tp(card, n) for n in (1, 2, 3, 6, 8, 12)] == [1, 2, 2, 4, 8, 8]


def test_assumed_memory_is_a_range_and_a_fit_inside_it_is_uncertain(card) -> None:  # type: ignore[no-untyped-def]
    # the card's assumed GPU: nominal 96 GiB down to the 97887 MiB NVML reports on it; the box
    # (no memory of its own) takes the range (pcieprof.tune.layout.gpu_memory)
    from pcieprof.tune.layout import gpu_memory
    box = gpu_memory(Box(gpus=8, arch="", arch_source="test"), card)
    assert (box.memory_low_bytes, box.memory_bytes) == (97887 * (1 << 20), 96 * GIB)
    assert box.memory_source.startswith("assumed: card glm5-nvfp4's gpu_memory_gib (96 GiB "
                                        "nominal, 95.6 GiB as NVML reports it (97887 MiB): "
                                        "range 95.6-96 GiB)")
    tp8 = M.Placement(tp=8)
    # 8K tokens: fits at both ends, the KV room said as a range
    f = M.fit(card, tp8, box, 8192)
    assert f.fits is True and not f.uncertain
    assert (f.requests_low, f.requests_per_gpu) == (33, 34)
    assert "has 81.3-81.6 = 95.6-96.0 GiB x --mem-fraction-static 0.85" in f.verdict()
    assert "KV room for 33-34 request(s) per GPU" in f.verdict()
    # a context whose one request fits 96 GiB but not 95.6: neither yes nor no
    need = M.weights_per_gpu(card, tp8)
    per_token = M.kv_per_request(card, tp8, 1)
    ctx = int((0.85 * (95.8 * GIB) - need) / per_token)
    f = M.fit(card, tp8, box, ctx)
    assert f.uncertain and f.fits is None and f.has is not None
    assert f.verdict().startswith("fit uncertain: needs ")
    assert "fits at 96.0 GiB (KV room for 1 request(s) per GPU), not at 95.6 GiB" in f.verdict()
    # at a context that fits neither end: no
    f = M.fit(card, tp8, box, ctx * 2)
    assert f.fits is False and f.verdict().startswith("does not fit this box")


def test_box_memory_is_a_point_not_a_range(card) -> None:  # type: ignore[no-untyped-def]
    # memory the box tells (NVML, or its product in gpus.toml) has no range and is not assumed
    box = Box(gpus=8, arch="sm90", arch_source="test", memory_bytes=81559 * (1 << 20),
              memory_source="NVML")
    f = M.fit(card, M.Placement(tp=8), box, 8192)
    assert f.requests_low is None and f.fits is True
    assert "has 67.7 = 79.6 GiB x --mem-fraction-static 0.85, KV room for 16 request(s)" \
        in f.verdict()
