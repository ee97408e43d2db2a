"""`pcieprof demo`, the README's first command, run for real (simulated box + reference server)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from builders.cli import cli


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    left = tmp_path / "left-behind.json"
    r = cli("demo", "--out", str(out), process=True, timeout=600, left_behind=left)
    assert r.returncode == 0, r.stderr[-2000:]
    # Its own deliberate choices (the reference server beside a GLM-5 box) are not warned of.
    said = [ln for ln in r.stderr.splitlines() if ln.startswith(("warning:", "model:"))]
    assert not said, said
    # The last lines say what to do next: open the page, measure a GPU box.
    tail = r.stdout.strip().splitlines()[-6:]
    assert any(f"open {(out / 'report.html').resolve().as_uri()}" in ln for ln in tail)
    assert any("pcieprof topology" in ln for ln in tail)
    html = (out / "report.html").read_text()
    text = re.sub(r"<[^>]+>", " ", html)
    # The first screen (the summary section) names the principal bottleneck of the VM box ...
    summary = html[html.index('<section id="summary">'):]
    first = re.sub(r"<[^>]+>", " ", summary[: summary.index("</section>")])
    assert "Principal bottleneck" in first
    assert "[simulated" in first
    # ... and the top three changes, each with a predicted or simulated gain.
    assert "Top 3 change" in first
    for n in (1, 2, 3):
        assert re.search(rf"\b{n}\.\s+\S", first), f"change {n} missing"
    # The serving part is labelled as measured on the CPU, never as GPU numbers.
    assert "backend cpu" in text
    # Bundles are complete and the reference server the demo started is gone (only the demo's
    # own process tree is looked at: other reference servers may run on this machine).
    for name in ("topology-rtxpro6000-8x-vm", "topology-rtxpro6000-8x-switch", "serve-tiny-cpu"):
        manifest = (out / name / "manifest.json").read_text()
        assert '"status": "ok"' in manifest, name
    assert (out / "topology-rtxpro6000-8x-vm" / "recommendations.json").is_file()
    assert "serve-bench" in (out / "serve-tiny-cpu" / "manifest.json").read_text()
    assert not [c for c in json.loads(left.read_text()) if "pcieprof.refserver" in c]


def test_demo_refuses_non_empty_out(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("x")
    r = cli("demo", "--out", str(tmp_path), process=True, timeout=60)
    assert r.returncode == 2
    assert "not empty" in r.stderr and "Traceback" not in r.stderr
