"""Evidence decides (issue 22, point 3): a bundle of the cpu backend (host-memory copies between
local processes, gloo) gets no GPU, P2P or NCCL advice, no NCCL files and no SGLang GPU command;
it says what it measured and what to run on a GPU box. The bundle is a real cpu-backend run
(tests/data/bundle_schema3/NOTE.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations

CPU = Path(__file__).resolve().parents[2] / "tests" / "data" / "bundle_schema3" / "cpu_4proc"


def test_a_cpu_backend_bundle_gets_no_gpu_advice(tmp_path: Path) -> None:
    box = tmp_path / "cpu"
    shutil.copytree(CPU, box)
    r = cli("recommend", str(box), "-q")
    assert r.returncode == 0, r.stderr
    doc = Bundle.open(box).read_doc(Recommendations)
    assert doc is not None
    assert [x.rule for x in doc.recommendations] == ["cpu_backend"]
    assert doc.env == {} and doc.layouts == [] and doc.ring is None
    rec = doc.recommendations[0]
    assert "host-memory copies between 4 local processes" in rec.gain_text
    assert "gloo all-reduce over 4 processes" in rec.gain_text
    assert "pcieprof topology" in rec.action and "pcieprof import" in rec.action
    for word in ("NCCL_", "simpleP2P", "sglang.launch_server", "CUDA_VISIBLE_DEVICES",
                 "broken", "P2P is"):
        assert word not in r.stdout, word
    assert "machine's CPUs" in doc.bottleneck
    assert not (box / "tune" / "nccl_graph.xml").exists()
    assert not (box / "tune" / "nccl_topo.xml").exists()
    assert "nothing to set" in (box / "tune" / "recommended.env").read_text()
    page = tmp_path / "r.html"
    fresh = tmp_path / "cpu-report"  # without recommendations.json: the report saves them first
    shutil.copytree(CPU, fresh)
    assert cli("report", str(fresh), "-o", str(page), "-q").returncode == 0
    text = page.read_text()
    assert "NCCL_GRAPH_FILE" not in text and "sglang.launch_server" not in text
