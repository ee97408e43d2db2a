"""The raw tables of the bundle: the first rows, folded, and a link to the whole CSV file."""

from __future__ import annotations

from typing import Any

from pcieprof.bundle.rows import TABLES, columns, encode
from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Section, Table

MAX_ROWS = 5  # a preview: the link under it opens every row
DIGITS = 6  # significant digits of a float in the preview (the CSV file keeps all of them)


def _preview(cell: Any) -> Any:
    return float(f"{cell:.{DIGITS}g}") if isinstance(cell, float) else cell


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    sec = Section("tables", "Raw tables")
    for name in TABLES:
        df = view.table(name)
        if df.empty:
            continue
        cols = columns(name)
        rows = [[_preview(v) for v in encode(name, {c: rec[c] for c in cols}).values()]
                for rec in df.head(MAX_ROWS).to_dict("records")]
        sec.blocks.append(Table(f"{TABLES[name].FILE} ({len(df)} rows)", cols, rows,
                                provenance=view.provenance(None, df), collapsed=True,
                                file=view.path / TABLES[name].FILE, total_rows=len(df)))
    if not sec.blocks:
        return None
    return sec
