"""The HTML report: bundles in, one self-contained offline page out.

`write_report(bundles, out)` is the entry point (used by `pcieprof topology`, `pcieprof report`
and `pcieprof demo`). Sections live in `pcieprof/report/sections/`, one module each.
"""

from __future__ import annotations

from pcieprof.report.builder import render_html, write_report
from pcieprof.report.context import ReportContext

__all__ = ["write_report", "render_html", "ReportContext"]
