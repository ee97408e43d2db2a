"""The sim backend: a plan run against the fabric model gives a complete simulated bundle."""

from __future__ import annotations

import json
import time
from pathlib import Path

from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.sim.backend import run_plan
from probes.plan import build_plan


def test_run_plan_writes_every_row(tmp_path: Path) -> None:
    plan = build_plan("sim", list(range(8)), quick=True)
    bundle = Bundle.create(tmp_path / "b", command="topology", source="simulated", backend="sim")
    run_plan(plan, "rtxpro6000-8x-vm", bundle)
    p2p, cc, ar = (bundle.read_table(t) for t in ("p2p", "concurrent", "allreduce"))
    assert len(p2p) == len(plan.p2p) and set(p2p["backend"]) == {"sim"}
    assert set(p2p["path"]) == {"p2p", "host_staged", "h2d", "d2h"}
    bw = p2p[(p2p.path == "p2p") & (p2p.direction == "uni") & p2p.bandwidth_gbps.notna()]
    assert len(bw) == 56 and bw.bandwidth_gbps.between(30, 56).all()
    lat = p2p[p2p.latency_us.notna()]
    assert (lat.bandwidth_gbps.isna()).all() and len(lat) > 0
    assert len(cc) == sum(len(c.flows) + 1 for c in plan.concurrent)
    expected = sum(len(c.sizes) * len(c.dtypes) for c in plan.allreduce)
    assert len(ar) == expected and set(ar["status"]) == {"ok"}
    assert ar.time_us.gt(0).all() and set(ar["variant"]) == {"default", "p2p_disable", "proto_ll"}
    choices = bundle.read_json("nccl_choices.json")
    assert set(choices) == {"default", "p2p_disable", "proto_ll"}
    parsed = choices["default"]["parsed"]
    assert parsed["nranks"] == 8 and parsed["peer_transport"]["0->1"].startswith("SHM")
    assert "not read from an NCCL log" in choices["default"]["note"]
    topo = bundle.read_json("topology.json")
    assert topo["source"] == "simulated" and topo["virtualization"]["flat_pcie_tree"]
    vm = topo["sim"]["vm"]
    assert vm["source"] == "simulated" and vm["bare_profile"] == "rtxpro6000-8x-switch"
    assert {r["basis"] for r in vm["rows"]} == {"default", "best", "best_safe", "same_choices"}
    assert {h["id"] for h in vm["host_changes"]} >= {"serve_on_host", "host_iommu_pt"}
    assert vm["known_issues"][0]["id"] == "nccl_p2p_hang_translated_iommu"
    # the default variant keeps NCCL off the translated P2P path; no known issue attached
    assert choices["default"]["model"]["known_risks"] == []
    parts = bundle.manifest.parts
    assert all(parts[p].status == "ok" and parts[p].source == "simulated"
               for p in ("discovery", "p2p", "concurrent", "allreduce"))


def test_concurrent_rows_show_the_collapse_on_bare_metal(tmp_path: Path) -> None:
    from pcieprof.bundle.plan import ConcurrentCase

    # GPU0 and GPU1 share uplink vs01; GPU4 and GPU6 sit behind two other root complexes.
    # (A pair like 0->2 would stay inside chip A and never reach the uplink.)
    plan = build_plan("sim", list(range(8)), quick=True)
    plan.concurrent = [ConcurrentCase("shared_uplink", op, [(0, 4), (1, 6)], 64 << 20, 2)
                       for op in ("write", "read")]
    bundle = Bundle.create(tmp_path / "b", command="topology", source="simulated", backend="sim")
    run_plan(plan, "rtxpro6000-8x-switch", bundle)
    cc = bundle.read_table("concurrent")
    flows = cc[cc.flow >= 0]
    writes, reads = flows[flows.op == "write"], flows[flows.op == "read"]
    assert writes.bandwidth_gbps.max() < 3 and reads.bandwidth_gbps.min() > 20
    assert writes.detail.str.contains("posted-write collapse").all()
    assert not reads.detail.str.contains("collapse").any()


def test_topology_command_with_the_sim_backend(tmp_path: Path) -> None:
    out = tmp_path / "vm"
    t0 = time.process_time()  # CPU time: the work, not what else a loaded machine ran meanwhile
    r = cli("topology", "--backend", "sim", "--sim-profile", "rtxpro6000-8x-vm", "--quick",
            "--no-report", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert time.process_time() - t0 < 30
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["source"] == "simulated"
    assert manifest["backend"] == "sim" and manifest["versions"]["sim_profile"] == "rtxpro6000-8x-vm"
    for name in ("topology.json", "p2p.csv", "concurrent.csv", "allreduce.csv", "nccl_choices.json"):
        assert (out / name).is_file(), name
