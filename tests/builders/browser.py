"""Reports in headless Chromium: what a page says of itself once drawn."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pcieprof.analysis.decode_band import band_for
from pcieprof.bundle import Bundle
from pcieprof.cards import load_card
from pcieprof.commands.tuning import for_report
from pcieprof.report import ReportContext, write_report

#: Headless Chromium flags of the report's browser tests (no network, no first-run work).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: Appended to a copy of a report: once the page's loader is done, <body> gets the page's size
#: at this window width and the number of figure titles wider than their box.
_MEASURE = """<script>(function wait() {
  var b = document.body;
  if (!b.dataset.done) { setTimeout(wait, 50); return; }
  var wide = 0;
  document.querySelectorAll(".figure h4").forEach(function (h) { if (h.scrollWidth > h.clientWidth + 1) wide++; });
  b.setAttribute("data-page-height", String(document.documentElement.scrollHeight));
  b.setAttribute("data-page-width", String(document.documentElement.scrollWidth));
  b.setAttribute("data-titles-cut", String(wide));
})();</script></body>"""


def run_chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with its own profile under `tmp`."""
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=180)


def page_facts(exe: str, report: Path, tmp: Path, *, width: int = 1366) -> dict[str, int]:
    """Open `report` in headless Chromium at `width` px and read what the page says of itself.

    Returns:
        The data-* numbers of <body> once drawn: figures-expected, figures-rendered, main-svgs,
        errors, page-height and page-width (px, document scroll size), titles-cut; and
        console: the number of console messages.
    """
    probe = tmp / f"{report.stem}.measure.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", _MEASURE),
                     encoding="utf-8")
    r = run_chromium(exe, tmp, "--enable-logging=stderr", "--v=0", f"--window-size={width},900",
                     "--virtual-time-budget=30000", "--dump-dom", probe.as_uri())
    body = re.search(r"<body([^>]*)>", r.stdout)
    assert body, r.stderr[-2000:]
    facts = {k: int(v) for k, v in re.findall(r'data-([a-z-]+)="(\d+)"', body.group(1))}
    facts["console"] = sum(":CONSOLE" in ln for ln in r.stderr.splitlines())
    return facts


def report_with_advice(bundles: list[Path], out: Path) -> Path:
    """The report as `pcieprof report` writes it: the tuner's advice computed by the command
    for bundles without recommendations.json (GLM-5's decode band)."""
    band = band_for()
    opened = [Bundle.open(p) for p in bundles]
    recs = for_report(opened, load_card(band.model), band)
    return write_report(opened, out, ctx=ReportContext(band=band, recommendations=recs))
