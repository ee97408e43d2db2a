"""The raw tables of the bundle (first rows), so every number in the figures can be checked."""

from __future__ import annotations

from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Note, Section, Table
from pcieprof.schema import TABLES

MAX_ROWS = 200


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    sec = Section("tables", "Raw tables")
    for name in TABLES:
        df = view.table(name)
        if df.empty:
            continue
        shown = df.head(MAX_ROWS)
        rows = [["" if (isinstance(v, float) and v != v) else v for v in r]
                for r in shown.itertuples(index=False)]
        sec.blocks.append(Table(f"{name}.csv ({len(df)} rows{', first ' + str(MAX_ROWS) if len(df) > MAX_ROWS else ''})",
                                list(df.columns), rows, provenance=view.provenance(None, df)))
    if not sec.blocks:
        return None
    sec.blocks.append(Note(f"full tables: {view.path}"))
    return sec
