"""The layouts' compute is anchored on a published decode curve: its communication is priced as the
published box paid it (once), not at this bundle's price (issue 22 pt 7)."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders.anchor_comm import anchor_comm_ms

from pcieprof.analysis.comm_model import Pricer
from pcieprof.bundle import Bundle
from pcieprof.bundle.topology import Topology
from pcieprof.cards import load_card
from pcieprof.tune import layout as L

GLM5 = load_card("glm5-nvfp4")


def test_the_anchor_communication_is_the_fabric_models_price_of_the_published_box() -> None:
    a = GLM5.decode_anchor  # the card file's [decode_anchor]
    for key, env in (("comm_ms", dict(a["comm_env"])), ("comm_ms_default", {})):
        for batch, ms in a[key]:
            assert ms == pytest.approx(anchor_comm_ms(GLM5, a["comm_profile"], env, a["tp"],
                                                      batch), abs=0.01), (key, batch)


@pytest.fixture
def vm(demo_bundles: dict[str, Path]) -> Bundle:
    """The demo's simulated VM box (made once per session; read only here)."""
    return Bundle.open(demo_bundles["rtxpro6000-8x-vm"])


def test_a_slower_box_is_not_predicted_as_fast_as_the_published_one(vm: Bundle) -> None:
    res = L.rank_layouts(vm, GLM5, Pricer(vm), topology=vm.read_doc(Topology), context=8192)
    tp8 = next(r for r in res if r.label == "TP8")
    published_c1 = 1000 / 51.5
    c1 = tp8.per_concurrency[0]
    # the VM's default all-reduces cost more than the published box's tuned ones: its step is longer
    assert c1.step_ms > published_c1 + 1.0
    assert "assumed: fabric model rtxpro6000-8x-switch" in tp8.compute_source
    # the verdict states its range: the top layout at the assumption's high end
    assert "range of the assumed anchor communication" in res[0].why


def test_a_bundle_that_served_the_model_prices_its_own_curve(tmp_path: Path, vm: Bundle) -> None:
    """Its own decode curve ran on its own box: no published box's communication is used."""
    anchor = L.anchor_curve(vm, GLM5)
    assert anchor is not None and anchor.comm_ms is not None  # published, this bundle served nothing
    assert anchor.comm_ms[1] < anchor.comm_ms_high[1]  # type: ignore[index]


def test_the_vm_verdict_shows_the_range_of_its_assumed_parameter(vm: Bundle) -> None:
    """latency.iommu_us = 0.3 is assumed (calibration/params.toml): the verdict says so and gives
    the like-for-like numbers at 0 and 1 us, where the VM's extra cost at decode sizes vanishes
    and grows."""
    from pcieprof.analysis.virtualization import from_topology
    from pcieprof.analysis.vm_words import verdict

    cost = from_topology(vm.read_doc(Topology))
    assert cost is not None
    (s,) = cost.sensitivity
    assert s["param"] == "latency.iommu_us" and s["value"] == pytest.approx(0.3)
    low, high = s["low"], s["high"]
    assert low["vm_us"] == pytest.approx(low["bare_us"], rel=0.02)  # no translation cost left
    assert high["vm_us"] > 1.3 * high["bare_us"]
    text = verdict(cost)
    assert "This rests on latency.iommu_us = 0.3 (assumed" in text and "at 0, " in text
    assert "at 1, " in text


@pytest.mark.parametrize("profile", ["rtxpro6000-8x-vm", "rtxpro6000-8x-switch"])
def test_one_token_time_or_why_two(demo_bundles: dict[str, Path], tmp_path: Path,
                                   profile: str) -> None:
    """The headline states the step's all-reduce as a part of the token the cards price their
    gains on, never as the token time (issue 22); where the layout table's c=1 step differs
    from that token, the layouts' `why` says by how much and why."""
    import re
    import shutil

    from pcieprof.analysis.decode_band import DecodeBand
    from pcieprof.commands.tuning import tune
    b = tmp_path / profile
    shutil.copytree(demo_bundles[profile], b)
    doc = tune(Bundle.open(b), GLM5, DecodeBand.of_card(GLM5, 1, 64), write_files=False)
    assert "ms per token" not in doc.bottleneck
    ar, token = re.search(r"= ([\d.]+) ms of all-reduce in a ~([\d.]+) ms token at batch 1",
                          doc.bottleneck).groups()
    shares = {m for r in doc.recommendations
              for m in re.findall(r"of a ~([\d.]+) ms token", r.gain_text)}
    assert shares == {token}  # the cards' token, the headline's token: one number
    tp8 = next(lay for lay in doc.layouts if lay.label == "TP8")
    c1 = tp8.per_concurrency[0]
    assert c1.concurrency == 1 and c1.step_ms is not None and c1.compute_ms is not None
    if f"{c1.step_ms:.1f}" != token:
        said = re.search(r"TP8's c=1 step \(([\d.]+) ms\) takes its compute from the roofline "
                         r"fitted over all \d anchor batches \(([\d.]+) ms\); the cards' token "
                         r"times take the anchor's own batch-1 point \(([\d.]+) ms\), so theirs "
                         r"are ([\d.]+) ms shorter", doc.layouts[0].why)
        assert said is not None, doc.layouts[0].why
        step, fitted, point, less = (float(x) for x in said.groups())
        assert step == pytest.approx(c1.step_ms, abs=0.05)
        assert fitted - point == pytest.approx(less, abs=0.11)
        # the table's step less the cards' token: the two computes' difference, and the
        # communication's where the layouts price the NCCL settings their lines set (the
        # cards' token is at NCCL's defaults: its all-reduce is the headline's)
        comm = re.search(r"; its communication \(([\d.]+) ms\) is priced with variant \w+, "
                         r"the NCCL settings its line sets", doc.layouts[0].why)
        moved = float(comm.group(1)) - float(ar) if comm else 0.0
        assert c1.step_ms - float(token) == pytest.approx(less + moved, abs=0.15)
    assert float(ar) < float(token)
