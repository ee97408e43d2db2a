"""The raw tables of the bundle: the first rows, folded, and a link to the whole CSV file."""

from __future__ import annotations

from pcieprof.bundle.rows import TABLES, columns, encode
from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Section, Table

MAX_ROWS = 5  # a preview: the link under it opens every row


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    sec = Section("tables", "Raw tables")
    for name in TABLES:
        df = view.table(name)
        if df.empty:
            continue
        cols = columns(name)
        rows = [list(encode(name, {c: rec[c] for c in cols}).values())
                for rec in df.head(MAX_ROWS).to_dict("records")]
        sec.blocks.append(Table(f"{TABLES[name].FILE} ({len(df)} rows)", cols, rows,
                                provenance=view.provenance(None, df), collapsed=True,
                                file=view.path / TABLES[name].FILE, total_rows=len(df)))
    if not sec.blocks:
        return None
    return sec
