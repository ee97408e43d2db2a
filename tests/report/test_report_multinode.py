"""The report and the console summary of a multi-node bundle (the committed two-node cpu run,
tests/data/bundle_schema3/cpu_2node): the layout, inter- vs intra-node groups, the transport,
and on node 1 where the rows are."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

from builders.cli import cli

from pcieprof.analysis.decode_band import band_for
from pcieprof.cards import DEFAULT_CARD
from pcieprof.bundle import Bundle
from pcieprof.report.console import summarize

TWO = Path(__file__).resolve().parents[2] / "tests" / "data" / "bundle_schema3" / "cpu_2node"


def _text(page: Path) -> str:
    t = page.read_text(encoding="utf-8")
    t = re.sub(r"<script.*?</script>", " ", t, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", t)))


def test_report_of_both_nodes(tmp_path: Path) -> None:
    for n in ("node0", "node1"):
        shutil.copytree(TWO / n, tmp_path / n)
    page = tmp_path / "both.html"
    r = cli("report", str(tmp_path / "node0"), str(tmp_path / "node1"), "-o", str(page), "-q")
    assert r.returncode == 0, r.stderr
    text = _text(page)
    assert "nodes: 2 nodes x 2 processes (the state above is node 0's)" in text
    assert "nodes: 2 nodes x 2 processes (the state above is node 1's)" in text
    assert "inter-node transport gloo over TCP (cpu backend: NCCL not used)" in text
    # the all-reduce figures name the group across the nodes; node 0's own GPUs beside them
    assert "all-reduce latency over 2 nodes x 2 processes (4 ranks, inter-node)" in text
    assert "0,1 (2 processes of node 0 (intra-node))" in text
    assert "0,1,2,3 (2 nodes x 2 processes (4 ranks, inter-node))" in text
    # node 1's bundle: its bottleneck says where the rows are, not "nothing measured"
    assert "this bundle is node 1 of a 2 nodes x 2 processes run, whose all-reduce rows are in " \
           "node 0's bundle" in text
    assert "4 GPUs" not in text and "this box: 4" not in text


def test_console_summary_of_node0() -> None:
    out = summarize(Bundle.open(TWO / "node0"), band_for(DEFAULT_CARD))
    assert "all-reduce time, us (2 nodes x 2 processes (4 ranks, inter-node), bf16" in out
    assert "layout: 2 nodes x 2 processes; this bundle is node 0 of 2" in out
    assert "collective rows: this bundle (allreduce.csv, nccl_choices.json)" in out
