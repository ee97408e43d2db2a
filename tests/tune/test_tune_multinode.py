"""`recommend` and `compare` on a multi-node bundle (the committed two-node cpu run,
tests/data/bundle_schema3/cpu_2node)."""

from __future__ import annotations

import shutil
from pathlib import Path

from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.cards import DEFAULT_CARD, load_card
from pcieprof.tune.recommend import recommend

TWO = Path(__file__).resolve().parents[2] / "tests" / "data" / "bundle_schema3" / "cpu_2node"


def test_the_bottleneck_names_the_nodes_and_both_groups() -> None:
    card = load_card(DEFAULT_CARD)
    doc = recommend(Bundle.open(TWO / "node0"), card, write_files=False)
    assert "over 2 nodes x 2 processes (4 ranks, inter-node)" in doc.bottleneck
    assert "intra-node (2 processes of node 0): " in doc.bottleneck
    assert "inter-node transport: gloo over TCP" in doc.bottleneck
    one = recommend(Bundle.open(TWO / "node1"), card, write_files=False)
    assert one.bottleneck.startswith("not named here: this bundle is node 1 of a 2 nodes x 2 "
                                     "processes run")
    # where node 0's rows are, as node 1 recorded it (the path on the recording machine)
    assert "whose all-reduce rows are in node 0's bundle (node 0 (vm): /" in one.bottleneck
    assert "/cpu_2node/node0); run pcieprof recommend on that bundle" in one.bottleneck


def test_recommend_command_prints_the_layout_and_refuses_verify(tmp_path: Path) -> None:
    b = tmp_path / "node0"
    shutil.copytree(TWO / "node0", b)
    r = cli("recommend", str(b), "-q")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "layout: 2 nodes x 2 processes; this bundle is node 0 of 2"
    assert "inter-node transport: gloo over TCP (cpu backend: NCCL not used)" in lines
    v = cli("recommend", str(b), "--verify", "-q")
    assert v.returncode == 2 and "is a 2 nodes x 2 processes bundle" in v.stderr
    assert "Traceback" not in v.stderr


def test_compare_says_the_layout_and_matches_groups(tmp_path: Path) -> None:
    b = tmp_path / "again"
    shutil.copytree(TWO / "node0", b)
    r = cli("compare", str(TWO / "node0"), str(b))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("A: 2 nodes x 2 processes (node 0's bundle; "
                                               "inter-node transport: gloo over TCP")
    assert "allreduce.default.2x2.time_us@12KiB" in r.stdout
    assert "allreduce.default.n2.time_us@12KiB" in r.stdout
