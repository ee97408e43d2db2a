"""Concurrent copies: aggregate and per-flow bandwidth per pattern, writes vs reads."""

from __future__ import annotations

import plotly.graph_objects as go

from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text
from pcieprof.report.model import BundleView, Note, Section


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    df = view.table("concurrent")
    if df.empty:
        return None
    sec = Section("concurrent", "Concurrent traffic")
    ok = df[(df["status"] == "ok") & df["bandwidth_gbps"].notna()]
    agg = ok[ok["flow"] == -1]
    flows = ok[ok["flow"] != -1]
    if not agg.empty:
        fig = go.Figure()
        for op, g in agg.groupby("op"):
            g = g.groupby("pattern", as_index=False)["bandwidth_gbps"].median()
            fig.add_trace(go.Bar(x=[plot_text(p) for p in g["pattern"]], y=g["bandwidth_gbps"],
                                 name=plot_text(op)))
        fig.update_layout(barmode="group")
        fig.update_yaxes(title="aggregate GB/s")
        sec.blocks.append(figure(fig, "concurrent copies: aggregate bandwidth per pattern, writes vs reads",
                                 view.provenance("concurrent", agg)))
    if not flows.empty:
        fig = go.Figure()
        for op, g in flows.groupby("op"):
            fig.add_trace(go.Box(x=[plot_text(p) for p in g["pattern"]], y=g["bandwidth_gbps"],
                                 name=plot_text(op), boxpoints="all"))
        fig.update_layout(boxmode="group")
        fig.update_yaxes(title="per-flow GB/s")
        sec.blocks.append(figure(fig, "concurrent copies: per-flow bandwidth (a write/read gap "
                                      "means posted writes collapse through a shared uplink)",
                                 view.provenance("concurrent", flows)))
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        sec.blocks.append(Note(f"{len(bad)} concurrent row(s) not ok: "
                               + ", ".join(sorted({f'{p} {s}' for p, s in zip(bad['pattern'], bad['status'])})[:8]), "warn"))
    return sec
