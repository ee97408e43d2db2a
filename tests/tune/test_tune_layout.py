"""Layout advice for GLM-5 on an 8-GPU box: memory fit, calibrated compute, ranking reasons."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders.bundles import add_allreduce, two_switch, write_matrix_bundle

from pcieprof.analysis.comm_model import Pricer
from pcieprof.bundle.topology import Topology
from pcieprof.cards import load_card
from pcieprof.commands.tuning import sglang_launch
from pcieprof.tune import layout as L

# WRX90 8-GPU ring (calibration README), size -> time_us; TP4 group: assumed 0.8x (no published
# 4-GPU curve on that box; only used to have a 4-rank curve to price TP4 with)
AR8 = {4 << 10: 23.93, 16 << 10: 18.66, 64 << 10: 18.13, 256 << 10: 25.09, 1 << 20: 81.08,
       4 << 20: 182.49}


@pytest.fixture
def box(tmp_path: Path):
    bw, lat = two_switch(seed=2)
    b = write_matrix_bundle(tmp_path / "box", bw, lat, flat_vm=False)
    add_allreduce(b, "default", {}, AR8)
    add_allreduce(b, "default", {}, {s: 0.8 * t for s, t in AR8.items()}, nranks=4, ranks=(0, 1, 2, 3))
    add_allreduce(b, "default", {}, {s: 0.6 * t for s, t in AR8.items()}, nranks=2, ranks=(0, 1))
    return b


def test_memory_fit_matches_published_figures() -> None:
    card = load_card("glm5-nvfp4")
    tp8 = L.weights_per_gpu(card, L.Candidate("TP8", tp=8))
    # published: about 57 GiB of weights per GPU at TP8 with the MTP layer (models/glm5.md;
    # its "GB" are GiB, tests/tune/test_tune_memory.py), ~2 GiB less without it
    assert tp8 / (1 << 30) == pytest.approx(55, rel=0.04)
    # half the box: does not fit a 96 GB GPU
    assert L.weights_per_gpu(card, L.Candidate("2x TP4", tp=4, replicas=2)) > 96e9


def test_compute_fit_reproduces_the_anchor(box) -> None:
    card = load_card("glm5-nvfp4")
    cm = L.fit_compute(card, Pricer(box), box)
    assert cm is not None and "published" in cm.source
    c = L.Candidate("TP8", tp=8)
    for batch, step_ms, comm_ms in cm.points:
        predicted = cm.compute_ms(L.bytes_read_per_step(card, c, batch, 1)) + comm_ms
        assert predicted == pytest.approx(step_ms, rel=0.15)
    assert 300 < cm.eff_gbps < 3000  # an effective memory bandwidth a GDDR7 GPU can have


def _rank(box, context: int) -> list:
    return L.rank_layouts(box, load_card("glm5-nvfp4"), Pricer(box),
                          topology=box.read_doc(Topology), context=context, command=sglang_launch)


def test_rank_layouts_on_the_box(box) -> None:
    res = _rank(box, 8192)
    labels = [r.label for r in res]
    assert set(labels) == {"TP8", "TP8+EP8", "PP2xTP4", "PP4xTP2", "TP8 DP-attention8",
                           "2 replicas x TP4"}
    by = {r.label: r for r in res}
    assert not by["2 replicas x TP4"].fits and labels[-1] == "2 replicas x TP4"
    # TP8 at batch 1: ~157 all-reduces of 12 KiB priced at ~18-24 us each -> a few ms of comm
    c1 = by["TP8"].per_concurrency[0]
    assert 2.0 < c1.comm_ms < 6.0
    # PP adds stages one after the other: slower at concurrency 1 than TP8
    assert by["PP4xTP2"].per_concurrency[0].step_ms > c1.step_ms
    assert "--tp-size 8" in by["TP8"].command and "--pp-size 2" in by["PP2xTP4"].command
    assert res[0].why and "driven by" in res[0].why
    # a short context lets TP8 hold 64 requests
    short = {r.label: r for r in _rank(box, 1024)}
    assert short["TP8"].max_concurrency >= 64


def test_layouts_without_a_launcher_have_no_command(box) -> None:
    res = L.rank_layouts(box, load_card("glm5-nvfp4"), Pricer(box), topology=box.read_doc(Topology))
    assert all(r.command == "" for r in res)
    assert all(any("no launch command" in n for n in r.notes) for r in res if r.fits)
    # a layout that does not fit says why instead, in GiB
    assert all(any("does not fit this box (needs" in n for n in r.notes) for r in res if not r.fits)


CONFIGS = Path(__file__).resolve().parents[1] / "data" / "cards"


@pytest.mark.parametrize("arch,ep,dpa", [("llama-3.1-70b", False, False),
                                         ("qwen3-235b-a22b", True, True),
                                         ("gpt-oss-120b", True, True)])
def test_candidates_follow_the_card(arch: str, ep: bool, dpa: bool) -> None:
    """A dense model gets no EP layout; DP attention only for a family whose SGLang 0.5.23 model
    shards attention over the attention-TP group (Llama's splits heads by the full TP)."""
    labels = [c.label for c in L.candidates(load_card(CONFIGS / arch / "config.json"), 8)]
    assert ("TP8+EP8" in labels) is ep
    assert ("TP8 DP-attention8" in labels) is dpa
    assert {"TP8", "PP2xTP4", "PP4xTP2", "2 replicas x TP4"} <= set(labels)


@pytest.mark.parametrize("arch", ["llama-3.1-70b", "qwen3-235b-a22b", "gpt-oss-120b"])
def test_no_compute_anchor_no_ranking(box, arch: str) -> None:
    """Without a decode curve for the model nothing predicts compute: the layouts are not ranked
    (no `why`, no layout claimed best), though their communication differs several-fold."""
    card = load_card(CONFIGS / arch / "config.json")
    res = L.rank_layouts(box, card, Pricer(box), topology=box.read_doc(Topology),
                         command=sglang_launch)
    reason = L.not_ranked(card, res)
    assert reason.startswith(f"not ranked: no compute anchor for {arch}")
    assert not any(r.why for r in res)
    fits = [r.fits for r in res]
    assert fits == sorted(fits, reverse=True)  # fitting ones first, then candidate order
    comm = [r.per_concurrency[0].comm_ms for r in res if r.fits]
    assert comm[0] > min(comm)  # TP8 first: the order is no ranking by communication either
    # the published GLM-5 anchor ranks: nothing to say
    glm = load_card("glm5-nvfp4")
    assert L.not_ranked(glm, L.rank_layouts(box, glm, Pricer(box),
                                            topology=box.read_doc(Topology))) == ""
