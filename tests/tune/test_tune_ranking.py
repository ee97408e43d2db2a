"""Every card says how it was ranked, and the order follows what it says (issue 24).

The demo's two simulated boxes (the VM profile and its bare-metal twin, as `pcieprof demo` makes
them): the page ranked on a mean over batch 1-64 it never stated, so a card showing -2.27 ms at
batch 1 stood above one showing -3.52 ms. Now each card carries its score and how it was made;
and no change listed under the VM's host-side card makes its own decode step slower.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders.browser import report_with_advice

from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.cards import load_card
from pcieprof.tune.recommend import recommend

GLM5 = load_card("glm5-nvfp4")


@pytest.fixture(scope="module")
def docs(demo_bundles: dict[str, Path]) -> dict[str, Recommendations]:
    return {name: recommend(Bundle.open(path), GLM5, write_files=False)
            for name, path in demo_bundles.items()}


def test_every_card_states_its_score_and_the_cards_are_in_score_order(
        docs: dict[str, Recommendations]) -> None:
    for name, doc in docs.items():
        recs = doc.recommendations
        assert recs, name
        assert [r.priority for r in recs] == sorted((r.priority for r in recs), reverse=True)
        for r in recs:
            m = re.match(r"score ([0-9.]+)", r.ranked_by)
            assert m, (name, r.rule, r.ranked_by)
            assert float(m.group(1)) == pytest.approx(r.priority, abs=0.06), (r.rule, r.ranked_by)


def test_a_gain_card_states_the_mean_it_is_ranked_on(docs: dict[str, Recommendations]) -> None:
    gains = [r for doc in docs.values() for r in doc.recommendations
             if "mean decode-step gain over batch" in r.ranked_by]
    assert {r.rule for r in gains} >= {"proto_ll", "p2p_level"}
    for r in gains:
        mean = sum(r.gain_ms_per_step.values()) / len(r.gain_ms_per_step)
        lo, hi = min(r.gain_ms_per_step), max(r.gain_ms_per_step)
        assert f"over batch {lo}-{hi}, {mean:.2f} ms" in r.ranked_by, r.ranked_by


def test_no_change_listed_on_the_host_card_makes_the_step_slower(
        docs: dict[str, Recommendations]) -> None:
    (card,) = [r for r in docs["rtxpro6000-8x-vm"].recommendations if r.rule == "iommu_acs"]
    listed = [ln for ln in card.action.splitlines()
              if ln.startswith("# - ") and " ms with the best setting" in ln]
    assert listed
    for ln in listed:
        before, after = map(float, re.search(r"step ([0-9.]+) -> [0-9.]+ ms with NCCL's defaults, "
                                             r"-> ([0-9.]+) ms", ln).groups())
        assert after < before, ln


def test_the_page_shows_how_each_card_was_ranked(demo_bundles: dict[str, Path],
                                                 tmp_path: Path) -> None:
    page = report_with_advice(list(demo_bundles.values()), tmp_path / "r.html").read_text(
        encoding="utf-8")
    cards = page.count('<div class="rec rec-')
    assert cards > 6
    assert page.count('<p class="rank">ranked by score ') == cards
    assert "highest score first (each card says how it was scored" in page
