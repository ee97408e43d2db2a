"""The raw tables of the bundle: the first rows, folded, and a link to the whole CSV file."""

from __future__ import annotations

from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Section, Table
from pcieprof.schema import TABLES

MAX_ROWS = 5  # a preview: the link under it opens every row


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    sec = Section("tables", "Raw tables")
    for name in TABLES:
        df = view.table(name)
        if df.empty:
            continue
        shown = df.head(MAX_ROWS)
        rows = [["" if (isinstance(v, float) and v != v) else v for v in r]
                for r in shown.itertuples(index=False)]
        sec.blocks.append(Table(f"{name}.csv ({len(df)} rows)", list(df.columns), rows,
                                provenance=view.provenance(None, df), collapsed=True,
                                file=view.path / f"{name}.csv", total_rows=len(df)))
    if not sec.blocks:
        return None
    return sec
