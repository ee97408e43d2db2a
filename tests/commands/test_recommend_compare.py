from __future__ import annotations

import json
import shutil
from pathlib import Path

from builders.bundles import add_allreduce, two_switch, write_matrix_bundle
from builders.cli import cli


def test_recommend_on_simulated_vm(sim_vm_bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / "vm"
    shutil.copytree(sim_vm_bundle, b)
    r = cli("recommend", str(b))
    assert r.returncode == 0, r.stderr
    assert "principal bottleneck:" in r.stdout and "simulated" in r.stdout
    doc = json.loads((b / "recommendations.json").read_text())
    assert doc["format"] == "pcieprof.recommendations/2"
    # `reported`: a gain published for another box, named as such (multi-token prediction)
    assert all(rec["confidence"] in ("simulated", "predicted", "advice", "reported")
               for rec in doc["recommendations"])
    env = (b / "tune" / "recommended.env").read_text()
    for k, v in doc["env"].items():
        assert f"export {k}=" in env
    cmd = (b / "tune" / "sglang_command.sh").read_text()
    assert "sglang.launch_server" in cmd and "--tp-size" in cmd
    # no ring order is recommended on this box: the graph file written before the rules is
    # not left behind for a reader to take as advice (only files the result names stay)
    assert "ring_order" not in {rec["rule"] for rec in doc["recommendations"]}
    assert not (b / "tune" / "nccl_graph.xml").exists()
    assert doc["layouts"] and {lay["label"] for lay in doc["layouts"]} >= {"TP8", "PP2xTP4", "PP4xTP2"}
    manifest = json.loads((b / "manifest.json").read_text())
    assert manifest["parts"]["recommendations"]["status"] == "ok"


def test_recommend_bad_input_is_one_line(tmp_path: Path) -> None:
    r = cli("recommend", str(tmp_path / "missing"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _pair(tmp_path: Path, slower: float) -> tuple[Path, Path]:
    bw, lat = two_switch(seed=1)
    a = write_matrix_bundle(tmp_path / "a", bw, lat)
    b = write_matrix_bundle(tmp_path / "b", bw, lat)
    curve = {12 << 10: 40.0, 96 << 10: 45.0, 1 << 20: 100.0}
    add_allreduce(a, "default", {}, curve)
    add_allreduce(b, "default", {}, {s: t * slower for s, t in curve.items()})
    return a.path, b.path


def test_compare_flags_a_regression(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, 1.2)
    r = cli("compare", str(a), str(b), "--fail-if", "allreduce.default.n8.time_us@12KiB>+10%")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "REGRESSION allreduce.default.n8.time_us@12KiB" in r.stdout
    assert "+20.0% worse" in r.stdout
    ok = cli("compare", str(a), str(b), "--fail-if", "allreduce.*.time_us@*>+25%",
                 "--fail-if", "p2p.p2p.bandwidth_gbps.median<-5%")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "no regression (2 condition(s))" in ok.stdout


def test_compare_bad_expressions_are_one_line(tmp_path: Path) -> None:
    import pytest

    from pcieprof.commands.compare import parse_condition
    from pcieprof.errors import BadInput

    for expr in ("allreduce time went up", "x>>1%", "p2p.x>+1%%", ">+3%"):
        with pytest.raises(BadInput):
            parse_condition(expr)
    c = parse_condition(" serve.c=4.tpot_ms.median > +10% ")
    assert c.failed(10.0, 11.5) and not c.failed(10.0, 10.5)
    d = parse_condition("p2p.p2p.bandwidth_gbps.min<-5")  # absolute: B more than 5 GB/s lower
    assert d.failed(50.0, 44.0) and not d.failed(50.0, 46.0)
    a, b = _pair(tmp_path, 1.0)
    for expr in ("allreduce time went up", "p2p.nonexistent>+1%"):
        r = cli("compare", str(a), str(b), "--fail-if", expr)
        assert r.returncode == 2, (expr, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_recommend_out_writes_a_copy_and_leaves_the_bundle(tmp_path: Path) -> None:
    bw, lat = two_switch(seed=3)
    src = write_matrix_bundle(tmp_path / "src", bw, lat).path
    before = {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    out = tmp_path / "out"
    r = cli("recommend", str(src), "--out", str(out), "--no-layouts")
    assert r.returncode == 0, r.stderr
    assert {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()} == before
    doc = json.loads((out / "recommendations.json").read_text())
    assert (out / "p2p.csv").read_bytes() == (src / "p2p.csv").read_bytes()
    graph = out / "tune" / "nccl_graph.xml"
    # the copy keeps the graph file only where its advice names it
    assert graph.is_file() == (str(graph) in (out / "recommendations.json").read_text())
    assert f"recommendations: {out / 'recommendations.json'}" in r.stdout
    for rec in doc["recommendations"]:  # files named by the advice are the copy's
        assert str(src / "tune") not in rec["action"]
    # a second run into the same directory needs --force; inside the bundle is refused
    again = cli("recommend", str(src), "--out", str(out), "--no-layouts")
    assert again.returncode == 2 and "--force" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert cli("recommend", str(src), "-o", str(out), "--force", "--no-layouts").returncode == 0
    inside = cli("recommend", str(src), "--out", str(src / "copy"), "--no-layouts")
    assert inside.returncode == 2 and "inside" in inside.stderr
