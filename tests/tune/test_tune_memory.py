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
