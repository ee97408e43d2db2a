"""The HTML report: bundles in, one self-contained offline page out.

`write_report(bundles, out, ctx=ReportContext(band, recommendations))` is the entry point (used
by `pcieprof topology`, `pcieprof report` and `pcieprof demo`). Sections live in
`pcieprof/report/sections/`, one module each. The report only draws: numbers come from
pcieprof.analysis, advice from the bundle's recommendations.json or from what the command
computed (ReportContext.recommendations); `console.py` is the plain-text summary for stdout.
"""

from __future__ import annotations

from pcieprof.report.builder import render_html, write_report
from pcieprof.report.context import ReportContext

__all__ = ["write_report", "render_html", "ReportContext"]
