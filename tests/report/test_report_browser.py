"""Open the report in headless Chromium: every figure renders, no console error, a screenshot."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pcieprof.report import write_report

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_renders_in_chromium(chromium: str, bundle_factory, tmp_path: Path) -> None:
    a = bundle_factory("before", host="<b>hostile</b>")
    b = bundle_factory("after", tuned=True)
    report = write_report([a.path, b.path], tmp_path / "report.html")
    r = _chromium(chromium, tmp_path, "--enable-logging=stderr", "--v=0",
                  "--virtual-time-budget=10000", "--dump-dom", report.as_uri())
    body = re.search(r"<body([^>]*)>", r.stdout)
    assert body, r.stderr[-2000:]
    attrs = dict(re.findall(r'data-([a-z-]+)="(\d+)"', body.group(1)))
    expected = int(attrs["figures-expected"])
    assert expected >= 10
    assert int(attrs["figures-rendered"]) == expected
    assert int(attrs["main-svgs"]) >= expected  # plotly draws >= 1 .main-svg per figure
    assert attrs["errors"] == "0"
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, console
    shot = tmp_path / "report.png"
    _chromium(chromium, tmp_path, "--window-size=1400,1600", "--virtual-time-budget=10000",
              f"--screenshot={shot}", report.as_uri())
    assert shot.is_file() and shot.stat().st_size > 20_000
