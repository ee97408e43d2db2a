"""The shared-uplink pattern must pick flows that really cross the uplink towards other root ports."""

from __future__ import annotations

from pathlib import Path

from pcieprof.bundle import Bundle
from pcieprof.sim.backend import run_plan
from pcieprof.sim.fabric import load_profile, topology
from probes.plan import build_plan, shared_uplink_flows


def test_flows_share_an_uplink_and_go_far() -> None:
    topo = topology(load_profile("rtxpro6000-8x-switch"))
    flows, why = shared_uplink_flows(list(range(8)), topo)
    (a, c), (b, e) = flows
    paths = topo["pcie_tree"]["gpu_paths"]
    assert paths[str(a)][-1] == paths[str(b)][-1], why  # same root port: one uplink
    roots = {paths[str(a)][-1], paths[str(c)][-1], paths[str(e)][-1]}
    assert len(roots) == 3, why  # two other root ports
    level = {(p["a"], p["b"]): p["level"] for p in topo["pairs"]}
    assert level.get((a, c), level.get((c, a))) == "SYS"  # the farthest, across sockets


def test_write_read_asymmetry_is_visible_in_the_rows(tmp_path: Path) -> None:
    fabric = load_profile("rtxpro6000-8x-switch")
    plan = build_plan("sim", list(range(8)), quick=True, topology=topology(fabric))
    b = Bundle.create(tmp_path / "b", command="topology", source="simulated", backend="sim")
    run_plan(plan, "rtxpro6000-8x-switch", b)
    df = b.read_table("concurrent")
    agg = df[(df["pattern"] == "shared_uplink") & (df["flow"] == -1)].set_index("op")
    assert agg.loc["write", "bandwidth_gbps"] < 0.2 * agg.loc["read", "bandwidth_gbps"]


def test_without_a_tree_the_assumption_is_said() -> None:
    flows, why = shared_uplink_flows([0, 1, 2, 3], None)
    assert flows == [(0, 2), (1, 3)]
    assert "assumed" in why
