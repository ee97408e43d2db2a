"""Rules on bundles whose numbers are known: each recommends only what its data supports."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders.bundles import add_allreduce, two_switch, write_matrix_bundle
from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.cards import load_card
from pcieprof.tune.recommend import recommend

GLM5 = load_card("glm5-nvfp4")

# dual-Turin published small-message times (calibration README): default vs NCCL_PROTO=LL / graph
TURIN_DEFAULT = {8: 45.0, 4096: 46.0, 32 << 10: 48.16, 64 << 10: 48.69, 128 << 10: 51.56,
                 256 << 10: 56.48, 1 << 20: 120.0}
TURIN_LL = {8: 20.0, 4096: 22.0, 32 << 10: 26.20, 64 << 10: 25.59, 128 << 10: 32.09,
            256 << 10: 37.26, 1 << 20: 140.0}


def _bundle(tmp_path: Path, name: str = "b", **kw):
    bw, lat = two_switch(seed=5)
    return write_matrix_bundle(tmp_path / name, bw, lat, **kw)


def _rules(result) -> dict[str, object]:
    return {r.rule: r for r in result.recommendations}


def test_ll_recommended_with_measured_gain_and_large_message_caveat(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    add_allreduce(b, "default", {}, TURIN_DEFAULT)
    add_allreduce(b, "proto_ll", {"NCCL_PROTO": "LL"}, TURIN_LL)
    # what NCCL chose, in the shape the topology probes store (parse_nccl_log output)
    b.write_json("nccl_choices.json", {"default": {
        "variant": "default", "ranks": list(range(8)), "env": {},
        "parsed": {"nchannels": 2, "rings": {"0": list(range(8))},
                   "tuner": [{"coll": "AllReduce", "bytes": s, "algo": "RING", "proto": "SIMPLE",
                              "channels": 2} for s in (32 << 10, 64 << 10, 128 << 10)]}}})
    res = recommend(b, GLM5, layouts=False)
    ll = _rules(res)["proto_ll"]
    assert any("chose SIMPLE for 3 size(s) (32 KiB..128 KiB)" in e for e in ll.evidence)
    assert any("2 channel(s) by default" in e for e in ll.evidence)
    # LL is slower at 1 MiB, and so (at that ratio) at the card's 192 MiB prefill chunk: it is
    # not set globally, the tuner plugin's size split is offered instead (issue 22 pt 4)
    assert ll.env == {} and ll.kind == "info" and "NCCL_PROTO" not in res.env
    conf = (b.path / "tune" / "nccl_tuner.conf").read_text().splitlines()
    assert "allreduce,0,262144,ring,ll,-1,1,-1" in conf  # the tuner plugin's file, in the bundle
    assert f"export NCCL_TUNER_CONFIG_FILE={b.path / 'tune' / 'nccl_tuner.conf'}" in ll.action
    # batch 1 = 12 KiB: between 4 KiB (46 vs 22) and 32 KiB (48.16 vs 26.2), log-log interpolated
    assert 20 < ll.gain_us_per_allreduce[1] < 25
    assert ll.gain_ms_per_step[1] > 0  # per-step gain counted with the analytic collective count
    assert any("slower at 1 MiB" in c for c in ll.caveats)
    assert ll.confidence == "measured"


def test_nothing_recommended_without_measured_variant(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    add_allreduce(b, "default", {}, TURIN_DEFAULT)
    res = recommend(b, GLM5, layouts=False)
    assert not any(r.env.get("NCCL_PROTO") for r in res.recommendations)
    assert any("NCCL_PROTO=LL" in m for m in res.needs_measuring)


def test_a_tuner_file_of_an_earlier_run_is_not_left_behind(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    add_allreduce(b, "default", {}, TURIN_DEFAULT)
    b.write_text("tune/nccl_tuner.conf", "allreduce,0,262144,ring,ll,-1,1,-1\n")
    recommend(b, GLM5, layouts=False)  # no LL variant: no tuner route this time
    assert not b.has("tune/nccl_tuner.conf")
    assert "tune/nccl_tuner.conf" not in Bundle.open(b.path).manifest.files


def test_worse_variant_is_not_recommended(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    add_allreduce(b, "default", {}, TURIN_LL)
    add_allreduce(b, "proto_ll", {"NCCL_PROTO": "LL"}, TURIN_DEFAULT)
    assert "proto_ll" not in _rules(recommend(b, GLM5, layouts=False))


def test_gloo_rows_never_give_nccl_advice(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    add_allreduce(b, "default", {}, TURIN_DEFAULT)
    add_allreduce(b, "proto_ll", {"NCCL_PROTO": "LL"}, TURIN_LL)
    import pandas as pd

    df = pd.read_csv(b.path / "allreduce.csv")
    df["backend"] = "cpu"
    df.to_csv(b.path / "allreduce.csv", index=False)
    res = recommend(b, GLM5, layouts=False)
    assert not any(r.kind == "env" for r in res.recommendations)


def test_min_nchannels_from_busbw(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    big = 256 << 20
    # calibration: busbw 22.2 -> 37.6 GB/s at large sizes with NCCL_MIN_NCHANNELS=8
    t = lambda busbw: big / (busbw * 8 / (2 * 7)) / 1e3  # noqa: E731
    add_allreduce(b, "default", {}, {32 << 10: 48.0, big: t(22.2)})
    add_allreduce(b, "nch8", {"NCCL_MIN_NCHANNELS": "8"}, {32 << 10: 47.0, big: t(37.6)})
    rec = _rules(recommend(b, GLM5, layouts=False))["min_nchannels"]
    assert rec.env == {"NCCL_MIN_NCHANNELS": "8"}
    assert rec.gain_fraction == pytest.approx(37.6 / 22.2 - 1, rel=0.01)


def test_p2p_errors_disable_p2p_first(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    b.append_rows("p2p", [{"backend": "imported", "src": 0, "dst": 5, "path": "p2p",
                           "direction": "uni", "size_bytes": 1 << 20, "status": "error",
                           "detail": "copied bytes differ"}])
    res = recommend(b, GLM5, layouts=False)
    assert res.recommendations[0].rule == "p2p_data_errors"
    assert res.recommendations[0].env == {"NCCL_P2P_DISABLE": "1"}
    assert "broken" in res.bottleneck


def test_iommu_rule_in_vm_points_to_the_host(tmp_path: Path) -> None:
    # P2P well below host-to-device on the same links, IOMMU translating, in a VM
    bw, lat = two_switch(seed=5)
    b = write_matrix_bundle(tmp_path / "vm", bw * 0.5, lat, flat_vm=True)
    b.append_rows("p2p", [{"backend": "imported", "src": -1, "dst": g, "path": "h2d",
                           "direction": "uni", "size_bytes": 1 << 28, "bandwidth_gbps": 55.0}
                          for g in range(8)])
    rec = _rules(recommend(b, GLM5, layouts=False))["iommu_acs"]
    assert rec.kind == "host"
    assert "iommu=pt" in rec.action and "guest cannot clear ACS" in rec.action
    # iommu=pt on the host leaves VFIO's translation in place: never offered as the fix
    assert "iommu=pt on the host kernel: no change for GPUs passed through with VFIO" in rec.action
    assert any("in a VM, ACS cannot be turned off" in c for c in rec.caveats)
    # no fabric model here: the gain is unknown, and the card says what to measure
    assert "not known from this bundle" in rec.gain_text and "pcieprof compare" in rec.gain_text


def test_hidden_switches_give_a_ring_and_no_invented_topo_file(tmp_path: Path) -> None:
    groups = ([0, 2, 4, 6], [1, 3, 5, 7])
    bw, lat = two_switch(groups, seed=9)
    b = write_matrix_bundle(tmp_path / "vm", bw, lat, flat_vm=True)
    add_allreduce(b, "default", {}, TURIN_DEFAULT)
    res = recommend(b, GLM5, layouts=False)
    rules = _rules(res)
    # switches only inferred from bandwidth: no topology file is invented (issue 22 pt 5)
    assert "topo_file" not in rules and not b.has("tune/nccl_topo.xml")
    assert any(m.startswith("NCCL_TOPO_FILE: ") for m in res.needs_measuring)
    ring = rules["ring_order"]
    assert ring.confidence == "predicted"
    assert "NCCL_GRAPH_FILE" in ring.env and b.has("tune/nccl_graph.xml")
    assert "assumed: device order" in ring.evidence[1]
    # identity order crosses 8 times: 4 flows per uplink direction; the ring crosses twice: 1
    assert ring.gain_fraction == pytest.approx(4 * 0.995 - 1, abs=0.15)
    assert "effective bottleneck" in ring.gain_text


def test_real_imports_give_honest_bottlenecks(samples: Path, tmp_path: Path) -> None:
    """Real tool outputs through the importer: a GPU without P2P, and an nccl-tests run
    that only measured 32 MiB (no decode-size claim may be made from it)."""
    out = samples / "tool-outputs"
    a, b = tmp_path / "proxmox", tmp_path / "tinybox"
    r = cli("import", str(out / "p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"),
                str(out / "topo_m_5gpu_5060ti_5070_proxmox_host.txt"), "-o", str(a), "-q")
    assert r.returncode == 0, r.stderr
    res = recommend(Bundle.open(a), GLM5, layouts=False)
    assert res.bottleneck.startswith("GPU 0 has no working P2P")
    assert "topo_file" not in _rules(res)  # bare-metal host: nothing hidden by a hypervisor
    r = cli("import", str(out / "all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt"),
                "-o", str(b), "-q")
    assert r.returncode == 0, r.stderr
    res = recommend(Bundle.open(b), GLM5, layouts=False)
    assert res.bottleneck.startswith("not named at decode sizes")
    assert not any(r.gain_us_per_allreduce for r in res.recommendations)


def test_default_hang_points_to_the_variant_that_works(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    b.append_rows("allreduce", [{"backend": "imported", "variant": "default", "env": "{}",
                                 "nranks": 8, "ranks": "0,1,2,3,4,5,6,7", "size_bytes": 8,
                                 "dtype": "bf16", "status": "hang",
                                 "detail": "no progress for 60 s (watchdog)"}])
    add_allreduce(b, "p2p_disable", {"NCCL_P2P_DISABLE": "1"}, TURIN_DEFAULT)
    res = recommend(b, GLM5, layouts=False)
    top = res.recommendations[0]
    assert top.rule == "allreduce_hang" and top.env == {"NCCL_P2P_DISABLE": "1"}
    assert "hangs" in res.bottleneck
