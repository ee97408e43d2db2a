"""Open the report in headless Chromium: every figure renders, no console error, a screenshot
(kept under the test's tmp dir)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from builders.browser import report_with_advice, run_chromium

def test_report_renders_inrun_chromium(chromium: str, sim_vm_variants_bundle: Path, bundle_factory,
                                    serve_bundle: Path, tmp_path: Path) -> None:
    vm = tmp_path / "vm"
    shutil.copytree(sim_vm_variants_bundle, vm)
    calib = bundle_factory("bare-metal", host="<b>hostile</b>")
    report = report_with_advice([vm, calib.path, serve_bundle], tmp_path / "report.html")
    html = report.read_text(encoding="utf-8")
    for section in ('id="summary"', 'id="compare"', 'id="machine"', 'id="p2p"', 'id="allreduce"',
                    'id="serve"', 'id="attribution"', 'id="recommendations"', 'id="tables"'):
        assert section in html, section
    r = run_chromium(chromium, tmp_path, "--enable-logging=stderr", "--v=0",
                  "--virtual-time-budget=15000", "--dump-dom", report.as_uri())
    body = re.search(r"<body([^>]*)>", r.stdout)
    assert body, r.stderr[-2000:]
    attrs = dict(re.findall(r'data-([a-z-]+)="(\d+)"', body.group(1)))
    expected = int(attrs["figures-expected"])
    assert expected >= 25
    assert int(attrs["figures-rendered"]) == expected
    assert int(attrs["main-svgs"]) >= expected  # plotly draws >= 1 .main-svg per figure
    assert attrs["errors"] == "0"
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, console
    assert "<b>hostile</b>" not in r.stdout  # the DOM shows it as text, never as an element
    shot = tmp_path / "report.png"
    run_chromium(chromium, tmp_path, "--window-size=1400,1000", "--virtual-time-budget=15000",
              f"--screenshot={shot}", report.as_uri())
    assert shot.is_file() and shot.stat().st_size > 20_000
    print(f"first screen of the report: {shot}")  # for people to look at (pytest -s)
