"""The HTML report: bundles in, one self-contained offline page out.

`write_report(bundles, out, ctx=ReportContext(band, unsaved))` is the entry point (used by
`pcieprof topology`, `pcieprof report` and `pcieprof demo`). Sections live in
`pcieprof/report/sections/`, one module each. The report only draws: numbers come from
pcieprof.analysis, advice from the bundle's recommendations.json, which the command saved first
(ReportContext.unsaved says why a bundle has none); `console.py` is the plain-text summary for
stdout.
"""

from __future__ import annotations

from typing import Any

from pcieprof.report.context import ReportContext

__all__ = ["write_report", "render_html", "ReportContext"]


def __getattr__(name: str) -> Any:
    # the page draws with plotly: imported when a page is drawn, so the plain-text summary
    # (console.py) and commands that measure work where plotly is not installed (a bare GPU
    # machine, issue 23 pt 9)
    if name in ("write_report", "render_html"):
        from pcieprof.report import builder

        return getattr(builder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
