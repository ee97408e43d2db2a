"""Reports in headless Chromium: what a page says of itself once drawn."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from pcieprof.analysis.decode_band import band_for
from pcieprof.bundle import Bundle
from pcieprof.cards import load_card
from pcieprof.commands.recommend import save_for_report
from pcieprof.report import ReportContext, write_report

#: Headless Chromium flags of the report's browser tests (no network, no first-run work).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: Appended to a copy of a report: once the page's loader is done, <body> gets the page's size
#: at this window width, the number of figure titles wider than their box, the navigation bar's
#: lines, the plotly controls drawn over a legend or a plot area, and (with every <details>
#: opened, so folded tables count too) the tables wider than their box, named in
#: data-tables-wide-list.
_MEASURE = """<script>(function wait() {
  var b = document.body;
  if (!b.dataset.done) { setTimeout(wait, 50); return; }
  function meets(a, c) {
    return a.width > 0 && a.height > 0 && c.width > 0 && c.height > 0 && a.left < c.right &&
           c.left < a.right && a.top < c.bottom && c.top < a.bottom;
  }
  var wide = 0;
  document.querySelectorAll(".figure h4").forEach(function (h) { if (h.scrollWidth > h.clientWidth + 1) wide++; });
  var over = 0;
  document.querySelectorAll(".js-plotly-plot").forEach(function (plot) {
    var data = [];
    plot.querySelectorAll(".legend, .nsewdrag").forEach(function (e) { data.push(e.getBoundingClientRect()); });
    plot.querySelectorAll(".modebar").forEach(function (m) {
      var r = m.getBoundingClientRect();
      if (getComputedStyle(m).display !== "none" && data.some(function (d) { return meets(r, d); })) over++;
    });
  });
  var nav = document.querySelector("nav"), link = nav.querySelector("a");
  b.setAttribute("data-page-height", String(document.documentElement.scrollHeight));
  b.setAttribute("data-page-width", String(document.documentElement.scrollWidth));
  b.setAttribute("data-titles-cut", String(wide));
  b.setAttribute("data-modebar-over-data", String(over));
  b.setAttribute("data-nav-lines", String(Math.round(nav.getBoundingClientRect().height / link.getBoundingClientRect().height)));
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  var cut = [];
  document.querySelectorAll("table").forEach(function (t) {
    var box = t.parentElement;
    if (box.scrollWidth > box.clientWidth + 1) {
      var h = t.closest(".table-wrap, section").querySelector("h4, h2");
      cut.push(t.closest("section").id + ": " + (h ? h.textContent.split(" [")[0] : "?") +
               " (" + box.scrollWidth + " > " + box.clientWidth + " px)");
    }
  });
  b.setAttribute("data-tables-wide", String(cut.length));
  b.setAttribute("data-tables-wide-list", cut.join(" | "));
})();</script></body>"""


def run_chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with its own profile under `tmp`."""
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=180)


def page_facts(exe: str, report: Path, tmp: Path, *, width: int = 1366) -> dict[str, Any]:
    """Open `report` in headless Chromium at `width` px and read what the page says of itself.

    Returns:
        The data-* numbers of <body> once drawn: figures-expected, figures-rendered, main-svgs,
        errors, page-height and page-width (px, document scroll size), titles-cut,
        modebar-over-data, nav-lines and tables-wide (see _MEASURE); console: the number of
        console messages; tables-wide-list: the tables wider than their box, by section and title.
    """
    probe = tmp / f"{report.stem}.measure.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", _MEASURE),
                     encoding="utf-8")
    r = run_chromium(exe, tmp, "--enable-logging=stderr", "--v=0", f"--window-size={width},900",
                     "--virtual-time-budget=30000", "--dump-dom", probe.as_uri())
    body = re.search(r"<body([^>]*)>", r.stdout)
    assert body, r.stderr[-2000:]
    facts: dict[str, Any] = {k: int(v) for k, v in
                             re.findall(r'data-([a-z-]+)="(\d+)"', body.group(1))}
    facts["console"] = sum(":CONSOLE" in ln for ln in r.stderr.splitlines())
    listed = re.search(r'data-tables-wide-list="([^"]*)"', body.group(1))
    facts["tables-wide-list"] = html.unescape(listed.group(1)) if listed else ""
    facts["dom"] = r.stdout  # the page as drawn
    return facts


def section_text(dom: str, section: str) -> str:
    """The text a reader sees in the <section id=`section`> of a drawn page (`page_facts`'s
    dom): tags dropped, entities decoded, white space collapsed ("" without that section)."""
    m = re.search(rf'<section id="{re.escape(section)}">(.*?)</section>', dom, re.S)
    if not m:
        return ""
    text = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", m.group(1), flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text))).strip()


def report_with_advice(bundles: list[Path], out: Path) -> Path:
    """The report of copies of `bundles` as `pcieprof report` writes it: recommend's result saved
    first into each copy without a current recommendations.json (GLM-5's decode band), then
    drawn. The copies (under `out`'s folder, each keeping its name, which labels its column)
    leave the given bundles, often a session's shared ones, as they are."""
    band = band_for()
    copies = []
    for i, p in enumerate(bundles):
        copies.append(out.parent / "bundles" / str(i) / p.name)
        shutil.copytree(p, copies[-1])
    opened = [Bundle.open(p) for p in copies]
    unsaved = save_for_report(opened, load_card(band.model), band)
    return write_report(opened, out, ctx=ReportContext(band=band, unsaved=unsaved))
