"""P2P and concurrent predictions: what the profiles must show, and the model's invariants."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.errors import BadInput
from pcieprof.sim import model
from pcieprof.sim.fabric import load_profile

GiB = 1 << 30
PAIRS = [(a, b) for a in range(8) for b in range(8) if a != b]


def test_vm_direct_p2p_is_slower_than_bare_metal_for_every_pair(vm, bare) -> None:
    for a, b in PAIRS:
        bw_vm, lat_vm = model.predict_p2p(vm, a, b, "p2p", "uni", GiB)
        bw_bm, lat_bm = model.predict_p2p(bare, a, b, "p2p", "uni", GiB)
        assert bw_vm < bw_bm and lat_vm > lat_bm, (a, b)


def test_acs_redirect_sends_same_switch_traffic_up_to_the_root(vm, bare) -> None:
    hops_vm = [h.key[0] for h in model.route(vm, 0, 1)]
    hops_bm = [h.key[0] for h in model.route(bare, 0, 1)]
    assert "uplink" in hops_vm and "rc" in hops_vm and "iommu" in hops_vm
    assert hops_bm == ["gpu", "switch", "gpu"]
    # both directions now share the one uplink: bidirectional is no more than one direction's link
    bi_vm = model.predict_p2p(vm, 0, 1, "p2p", "bi", GiB)[0]
    assert bi_vm < 0.55 * model.predict_p2p(bare, 0, 1, "p2p", "bi", GiB)[0]


def test_same_chip_partitions_bypass_the_uplinks_on_bare_metal(bare) -> None:
    keys = [h.key[0] for h in model.route(bare, 0, 2)]
    assert "chip" in keys and "uplink" not in keys
    assert "uplink" in [h.key[0] for h in model.route(bare, 0, 4)]


def test_posted_write_collapse_writes_only(bare, vm) -> None:
    trigger = [(0, 4), (1, 6)]  # GPU0, GPU1 share uplink vs01; dsts behind rp80 and rpf0
    writes = model.predict_concurrent(bare, trigger, "write", 256 << 20)
    reads = model.predict_concurrent(bare, trigger, "read", 256 << 20)
    assert max(writes) <= 2.7 + 1e-9 and min(reads) > 20
    one_root = model.predict_concurrent(bare, [(0, 4), (1, 5)], "write", 256 << 20)
    assert min(one_root) > 20  # one destination root complex: healthy
    single = model.predict_concurrent(bare, [(0, 4)], "write", 256 << 20)
    # one cross-chip stream alone: 39.6 GB/s measured (torch copy), 37.6-42.4 (p2pmark)
    assert 35 < single[0] < 47
    assert min(model.predict_concurrent(vm, trigger, "write", 256 << 20)) > 15  # translation masks it
    direct = load_profile("rtxpro6000-8x-direct")
    assert min(model.predict_concurrent(direct, [(0, 4), (1, 6)], "write", 256 << 20)) > 20


def test_shared_links_are_never_oversubscribed(bare) -> None:
    flows = PAIRS
    rates = model.predict_concurrent(bare, flows, "read", GiB)
    load: dict[tuple[str, ...], float] = {}
    cap: dict[tuple[str, ...], float] = {}
    for (s, d), r in zip(flows, rates):
        for h in model.route(bare, s, d):
            if h.gbps != float("inf"):
                load[h.key] = load.get(h.key, 0.0) + r
                cap[h.key] = h.gbps
    assert all(load[k] <= cap[k] * 1.0001 for k in load)
    assert all(r > 0 for r in rates)


def test_paths_and_sizes(bare) -> None:
    p2p = model.predict_p2p(bare, 0, 1, "p2p", "uni", GiB)
    staged = model.predict_p2p(bare, 0, 1, "host_staged", "uni", GiB)
    assert staged[0] < p2p[0] and staged[1] > 10 * p2p[1]
    h2d = model.predict_p2p(bare, -1, 3, "h2d", "uni", GiB)[0]
    d2h = model.predict_p2p(bare, 3, -1, "d2h", "uni", GiB)[0]
    assert 50 < h2d < 63 and 50 < d2h < 63
    small = model.predict_p2p(bare, 0, 1, "p2p", "uni", 64 << 10)[0]
    assert small < 0.5 * p2p[0]  # a 64 KiB copy is dominated by its setup cost
    gen4 = load_profile("generic-8x-pcie4")
    assert model.predict_p2p(gen4, 0, 1, "p2p", "uni", GiB)[0] < 31.5


def test_bad_arguments(bare) -> None:
    with pytest.raises(BadInput):
        model.predict_p2p(bare, 0, 0, "p2p", "uni", GiB)
    with pytest.raises(BadInput):
        model.predict_p2p(bare, 0, 1, "nvlink", "uni", GiB)
    with pytest.raises(BadInput):
        model.predict_p2p(bare, 0, 9, "p2p", "uni", GiB)
    with pytest.raises(BadInput):
        model.predict_concurrent(bare, [(0, 1)], "atomics", GiB)


def test_cross_chip_route_is_hops_in_series_with_the_window_last(bare) -> None:
    kinds = [h.kind for h in model.route(bare, 0, 4)]
    assert kinds == ["gpu", "switch", "uplink", "rc", "xgmi", "rc", "uplink", "switch", "window", "gpu"]
    lat = model.p2p_latency_us(bare, 0, 4)
    assert lat > 1.5 * model.p2p_latency_us(bare, 0, 2)  # two switch traversals and the crossing
    # the far side is a switch away: the window, not a link, sets the rate, well below the
    # direct-attach crossing (51 GB/s) and the links (55.6)
    direct = load_profile("rtxpro6000-8x-direct")
    cross_switch = model.predict_p2p(bare, 0, 4, "p2p", "uni", GiB)[0]
    cross_direct = model.predict_p2p(direct, 0, 4, "p2p", "uni", GiB)[0]
    assert cross_switch < 0.9 * cross_direct and cross_direct == pytest.approx(51.0, rel=0.01)
    window = next(h for h in model.route(direct, 0, 4) if h.kind == "window")
    assert window.gbps > 2 * 51.0  # short far side: the window does not bind on direct attach


def test_one_window_per_source_root_complex(bare) -> None:
    one = sum(model.predict_concurrent(bare, [(0, 4)], "write", GiB))
    same_root = sum(model.predict_concurrent(bare, [(0, 4), (1, 5)], "write", GiB))
    two_roots = sum(model.predict_concurrent(bare, [(0, 4), (2, 6)], "write", GiB))
    assert same_root == pytest.approx(one, rel=0.01)  # published: 43.3 total
    assert two_roots == pytest.approx(2 * one, rel=0.01)  # published: 79.0 total
    # reads are not posted: no window, the read ceiling of the link instead
    read = model.predict_concurrent(bare, [(0, 4)], "read", GiB)[0]
    assert read > one * 1.1


def test_uplink_is_in_series_only_on_routes_that_leave_the_chip() -> None:
    slow = load_profile(Path(__file__).resolve().parents[2] / "pcieprof/sim/calibration/boxes/asus-gen2-uplinks.toml")
    assert model.predict_p2p(slow, 0, 4, "p2p", "bi", GiB)[0] < 15  # Gen2 x16: 7 GB/s a direction
    assert model.predict_p2p(slow, 0, 2, "p2p", "bi", GiB)[0] > 100  # same chip: no uplink


def test_pair_classes(bare) -> None:
    assert [model.pair_class(bare, 0, b) for b in (1, 2, 4, 6)] == \
        ["same switch", "same chip", "cross chip", "cross chip"]
    direct = load_profile("rtxpro6000-8x-direct")
    assert model.pair_class(direct, 0, 1) == "same socket direct"
    assert model.pair_class(direct, 0, 4) == "cross socket direct"


def test_translation_costs_only_routes_through_the_iommu(vm) -> None:
    from pcieprof.sim.fabric import apply_changes

    # a translated box whose switch ports do not redirect: same-switch traffic never reaches the
    # IOMMU, so it is neither translated nor slowed (and the model says so)
    no_acs = apply_changes(vm, {"acs.redirect": False})
    assert "iommu" not in [h.kind for h in model.route(no_acs, 0, 1)]
    assert model.predict_p2p(no_acs, 0, 1, "p2p", "uni", GiB)[0] > \
        model.predict_p2p(vm, 0, 1, "p2p", "uni", GiB)[0]
