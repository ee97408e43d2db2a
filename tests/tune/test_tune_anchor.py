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
