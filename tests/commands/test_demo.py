"""`pcieprof demo`, the README's first command, run for real (simulated box + reference server)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


def _refserver_pids() -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"pcieprof.refserver" in cmd:
            pids.append(int(p.name))
    return pids


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_end_to_end(tmp_path: Path) -> None:
    before = set(_refserver_pids())
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "pcieprof", "demo", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
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
    # Bundles are complete and the reference server is gone.
    for name in ("topology-rtxpro6000-8x-vm", "topology-rtxpro6000-8x-switch", "serve-tiny-cpu"):
        manifest = (out / name / "manifest.json").read_text()
        assert '"status": "ok"' in manifest, name
    assert (out / "topology-rtxpro6000-8x-vm" / "recommendations.json").is_file()
    assert set(_refserver_pids()) <= before


def test_demo_refuses_non_empty_out(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("x")
    r = subprocess.run([sys.executable, "-m", "pcieprof", "demo", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "not empty" in r.stderr and "Traceback" not in r.stderr
