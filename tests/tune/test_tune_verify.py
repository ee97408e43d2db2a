"""`pcieprof recommend --verify`: re-run the all-reduce with the recommendations, same backend."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from builders.bundles import sim_bundle
from builders.cli import cli

from pcieprof.analysis.decode_band import band_for
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.commands.recommend import measure_verify
from pcieprof.tune.verify import CPU_NOTE, plan_verify, verify_lines, verify_results
from probes.variants import GLOO_IGNORES_NCCL

CPU_BUNDLE = Path(__file__).resolve().parents[1] / "report" / "data" / "cpu_2rank_topology"
KiB = 1024


@pytest.fixture(scope="module")
def sim_sys_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulated VM box, quick plan plus the NCCL_P2P_LEVEL=SYS variant (the rule needs it)."""
    return sim_bundle(tmp_path_factory.mktemp("simv") / "vm", "rtxpro6000-8x-vm", "--quick",
                      "--variants", "default,p2p_disable,p2p_level_sys,proto_ll")


def test_verify_sim_p2p_level_gain_is_the_models(sim_sys_bundle: Path, tmp_path: Path) -> None:
    from pcieprof.sim.collectives import predict_allreduce
    from pcieprof.sim.fabric import load_profile

    b = tmp_path / "vm"
    shutil.copytree(sim_sys_bundle, b)
    r = cli("recommend", str(b), "--no-layouts", "--verify", process=True)
    assert r.returncode == 0, r.stderr
    vdir = b / "verify"
    man = json.loads((vdir / "manifest.json").read_text())
    assert (man["source"], man["backend"], man["command"]) == ("simulated", "sim", "recommend-verify")
    ar = pd.read_csv(vdir / "allreduce.csv")
    assert set(ar["backend"]) == {"sim"} and set(ar["variant"]) >= {"default", "rec_p2p_level"}
    doc = json.loads((b / "recommendations.json").read_text())
    rec = next(x for x in doc["recommendations"] if x["env"] == {"NCCL_P2P_LEVEL": "SYS"})
    v = rec["verified"]
    assert v["source"] == "simulated" and "simulated" in v["provenance"]
    # the VM's IOMMU translates: the rule carries the hang risk, which the model cannot re-run
    assert [k["id"] for k in rec["risks"]] == ["nccl_p2p_hang_translated_iommu"]
    assert "the fabric model does not model hangs" in v["note"]

    fabric = load_profile("rtxpro6000-8x-vm")
    ranks = list(range(8))
    band = band_for("glm5-nvfp4", 1, 64)
    sizes = [band.message_bytes(bt) for bt in (1, 2, 4, 8, 16, 32, 64)]
    assert sizes[0] == 12 * KiB and sizes[-1] == 768 * KiB
    assert [p["size_bytes"] for p in v["per_size"]] == sizes + [64 << 20]
    t_base, _ = predict_allreduce(fabric, ranks, 12 * KiB, "bf16", {})
    t_sys, _ = predict_allreduce(fabric, ranks, 12 * KiB, "bf16", {"NCCL_P2P_LEVEL": "SYS"})
    assert t_sys < t_base
    assert v["baseline_time_us"] == pytest.approx(t_base, abs=2e-3)
    assert v["time_us"] == pytest.approx(t_sys, abs=2e-3)
    assert v["gain_us"] > 0 and v["gain_us"] == pytest.approx(t_base - t_sys, abs=4e-3)
    # the prediction came from the original bundle, which the same model wrote
    assert v["predicted_gain_us"] == pytest.approx(v["gain_us"], rel=1e-3)
    assert v["predicted_time_us"] == pytest.approx(v["time_us"], rel=1e-3)
    for p in v["per_size"][:-1]:
        tb, _ = predict_allreduce(fabric, ranks, p["size_bytes"], "bf16", {})
        ts, _ = predict_allreduce(fabric, ranks, p["size_bytes"], "bf16", {"NCCL_P2P_LEVEL": "SYS"})
        assert p["gain_fraction"] == pytest.approx((tb - ts) / tb, abs=1e-3)
    line = next(x for x in r.stdout.splitlines() if x.startswith("verify p2p_level:"))
    assert f"predicted {v['predicted_time_us']:.1f} us -> simulated {v['time_us']:.1f} us" in line
    # the report shows the verified gain next to the predicted one
    html = tmp_path / "r.html"
    rr = cli("report", str(b), "-o", str(html))
    assert rr.returncode == 0, rr.stderr
    text = html.read_text()
    assert "verified (simulated" in text and "verified by re-running the all-reduce" in text


def test_verify_cpu_runs_gloo_and_claims_no_gain(tmp_path: Path) -> None:
    b = tmp_path / "cpu"
    shutil.copytree(CPU_BUNDLE, b)
    bundle = Bundle.open(b)
    rec = Recommendation(rule="proto_ll", title="LL at decode sizes", kind="env",
                         env={"NCCL_PROTO": "LL"}, gain_us_per_allreduce={1: 5.0}, gain_fraction=0.1)
    band = band_for("glm5-nvfp4", 1, 2)
    plan = plan_verify(bundle, [rec], band, large_bytes=256 * KiB)
    vb = measure_verify(bundle, plan, b / "verify", timeout_s=60.0)
    blocks = verify_results(bundle, vb, plan, [rec], band)
    assert (vb.backend, vb.source) == ("cpu", "measured")
    ar = vb.read_table("allreduce")
    ok = ar[ar["status"] == "ok"]
    assert set(ok["backend"]) == {"cpu"} and set(ok["variant"]) == {"default", "rec_proto_ll"}
    assert sorted(set(ok["size_bytes"])) == [12 * KiB, 24 * KiB, 256 * KiB]
    assert set(ok[ok["variant"] == "rec_proto_ll"]["detail"]) == {GLOO_IGNORES_NCCL}
    v = blocks["proto_ll"]
    assert v["backend"] == "cpu" and v["note"] == CPU_NOTE and "no gain claimed" in v["text"]
    assert v["gain_us"] is None and v["gain_fraction"] is None and v["band_gain_fraction"] is None
    assert all(p["gain_fraction"] is None for p in v["per_size"])
    assert math.isfinite(v["time_us"]) and v["time_us"] > 0 and v["baseline_time_us"] > 0


def test_verify_cpu_bundle_with_nothing_to_verify_is_one_line(tmp_path: Path) -> None:
    b = tmp_path / "cpu"
    shutil.copytree(CPU_BUNDLE, b)
    r = cli("recommend", str(b), "--verify", "-q", process=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "nothing to verify" in r.stderr
    assert not (b / "verify").exists()


def test_verify_without_allreduce_rows_is_one_line(tmp_path: Path) -> None:
    out = sim_bundle(tmp_path / "copies", "rtxpro6000-8x-vm", "--quick", "--probes", "copies")
    r = cli("recommend", str(out), "--no-layouts", "--verify", process=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "all-reduce" in r.stderr


def test_verify_imported_bundle_is_one_line(vm_bundle: Bundle) -> None:
    r = cli("recommend", str(vm_bundle.path), "--no-layouts", "--verify", process=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "imported" in r.stderr


def test_verify_kills_a_hanging_setting_and_says_so(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The hang of NCCL_P2P_LEVEL=SYS over a translating IOMMU, for real on this machine's CPUs:
    the test-only hook (probes/rows.py) makes rank 1 hang at the first decode size in the launch
    that applies the recommendation; --verify's watchdog kills it at the deadline, the baseline
    stands, and the recommendation's verified block says HANG instead of a time."""
    monkeypatch.setenv("PCIEPROF_TEST_HOOKS", "i-know-this-is-for-tests")
    monkeypatch.setenv("PCIEPROF_TEST_HANG", f"1:{12 * KiB}:rec_p2p_level")
    b = tmp_path / "cpu"
    shutil.copytree(CPU_BUNDLE, b)
    bundle = Bundle.open(b)
    rec = Recommendation(rule="p2p_level", title="P2P at every distance", kind="env",
                         env={"NCCL_P2P_LEVEL": "SYS"}, gain_us_per_allreduce={1: 5.0},
                         gain_fraction=0.1)
    band = band_for("glm5-nvfp4", 1, 2)
    plan = plan_verify(bundle, [rec], band, large_bytes=256 * KiB)
    vb = measure_verify(bundle, plan, b / "verify", timeout_s=5.0)
    ar = vb.read_table("allreduce")
    hung = ar[ar["status"] == "hang"]
    assert len(hung) == 1 and hung.iloc[0]["variant"] == "rec_p2p_level"
    assert int(hung.iloc[0]["size_bytes"]) == 12 * KiB and "no progress" in hung.iloc[0]["detail"]
    assert set(ar[ar["variant"] == "default"]["status"]) == {"ok"}  # the baseline ran
    v = verify_results(bundle, vb, plan, [rec], band)["p2p_level"]
    assert v["status"] == "hang" and v["time_us"] is None and v["gain_us"] is None
    assert v["note"].startswith("HANG") and "watchdog" in v["note"] and "do not serve" in v["note"]
    assert "HANG" in v["text"]
    assert any("HANG" in line for line in verify_lines([rec], {"p2p_level": v}))
