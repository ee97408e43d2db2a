"""The raw tables of the bundle (first rows), so every number in the figures can be checked."""

from __future__ import annotations

from pcieprof.bundle.rows import TABLES, columns, encode
from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Note, Section, Table

MAX_ROWS = 200


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    sec = Section("tables", "Raw tables")
    for name in TABLES:
        df = view.table(name)
        if df.empty:
            continue
        shown = df.head(MAX_ROWS)
        cols = columns(name)
        rows = [list(encode(name, {c: rec[c] for c in cols}).values())
                for rec in shown.to_dict("records")]
        sec.blocks.append(Table(f"{TABLES[name].FILE} ({len(df)} rows"
                                f"{', first ' + str(MAX_ROWS) if len(df) > MAX_ROWS else ''})",
                                cols, rows, provenance=view.provenance(None, df)))
    if not sec.blocks:
        return None
    sec.blocks.append(Note(f"full tables: {view.path}"))
    return sec
