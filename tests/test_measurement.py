"""The measurement session (pcieprof/measurement.py): backend dispatch, part status, errors, and
the topology report written once the bundle is final."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.errors import BadInput
from pcieprof.measurement import MeasurementSession, allreduce_plan
from pcieprof.sim.fabric import DEFAULT_PROFILE
from probes.plan import build_plan


def test_sim_plan_runs_with_the_default_profile(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="topology", source="simulated", backend="sim")
    plan = allreduce_plan("sim", [0, 1, 2, 3], [("default", {}, None, "baseline"),
                                                ("sys", {"NCCL_P2P_LEVEL": "SYS"}, (0, 2, 1, 3), "x")],
                          [12 << 10, 96 << 10], timeout_s=10)
    with MeasurementSession(b) as session:
        session.measure(plan)
    assert b.finish() == "ok"
    assert b.manifest.versions["sim_profile"] == DEFAULT_PROFILE
    ar = b.read_table("allreduce")
    assert set(ar["variant"]) == {"default", "sys"} and set(ar["size_bytes"]) == {12 << 10, 96 << 10}
    assert set(ar[ar["variant"] == "sys"]["ranks"]) == {(0, 2, 1, 3)}
    assert b.part("allreduce").status == "ok" and b.part("allreduce").source == "simulated"


def test_an_error_inside_leaves_a_partial_bundle(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="topology", source="simulated", backend="sim")
    plan = build_plan("sim", [0, 9], quick=True)  # the VM profile has GPUs 0..7
    with pytest.raises(BadInput):
        with MeasurementSession(b) as session:
            session.measure(plan)
    m = json.loads((b.path / "manifest.json").read_text())
    assert m["status"] == "partial" and m["why"].startswith("stopped by an error")


def test_the_topology_report_shows_the_finished_bundle(tmp_path: Path) -> None:
    out = tmp_path / "vm"
    r = cli("topology", "--backend", "sim", "--quick", "--max-size", "64KiB", "-q", "-o", str(out),
            process=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "ok" and m["parts"]["report"]["status"] == "ok"
    assert "report.html" in m["files"]
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "bundle status ok" in html and "bundle status partial" not in html
