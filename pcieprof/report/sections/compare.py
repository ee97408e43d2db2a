"""Several bundles at once (bare metal vs VM, before vs after): overlaid curves and metrics."""

from __future__ import annotations

import plotly.graph_objects as go

from pcieprof.analysis.curves import Curves
from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text
from pcieprof.units import size_label
from pcieprof.analysis.metrics import bundle_metrics, higher_is_better
from pcieprof.analysis.virtualization import is_vm
from pcieprof.report.model import BundleView, Note, Section, Table

_TICKS = [8, 1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20]


def build(views: list[BundleView], ctx: ReportContext) -> Section | None:
    """One shared section comparing every bundle with the first."""
    if len(views) < 2:
        return None
    sec = Section("compare", f"Side by side: {len(views)} bundles (relative to the first)")
    fig = go.Figure()
    provs = []
    for v in views:
        base = Curves(v.table("allreduce")).default()
        if base is None:
            continue
        provs.append(f"{v.label}: {v.provenance('allreduce', v.table('allreduce'))}")
        fig.add_trace(go.Scatter(x=base.time_us.index, y=base.time_us.values, mode="lines+markers",
                                 name=plot_text(f"{v.label} ({base.variant}, {base.nranks} ranks)")))
    if fig.data:
        fig.add_vrect(x0=ctx.band.lo_bytes, x1=ctx.band.hi_bytes, fillcolor="orange", opacity=0.15,
                      line_width=0)
        fig.update_xaxes(type="log", title="message size (bytes)", tickvals=_TICKS,
                         ticktext=[size_label(t) for t in _TICKS])
        fig.update_yaxes(type="log", title="us")
        sec.blocks.append(figure(fig, "default all-reduce latency, every bundle (decode band shaded)",
                                 "; ".join(provs)))
    metrics = [bundle_metrics(v.bundle, ctx.band) for v in views]
    names = sorted(set(metrics[0]).intersection(*map(set, metrics[1:])))
    rows = []
    for n in names:
        a = metrics[0][n]
        row: list[object] = [n, f"{a:.4g}"]
        for m in metrics[1:]:
            b = m[n]
            rel = (b - a) / abs(a) * 100 if a else 0.0
            better = (rel > 0) == higher_is_better(n)
            row += [f"{b:.4g}", f"{rel:+.1f}%" + ("" if abs(rel) < 0.05 else (" better" if better else " worse"))]
        rows.append(row)
    vms = [v for v in views if is_vm(v.bundle)]
    if vms and len(vms) < len(views):
        sec.blocks.insert(0, Note(
            f"What the VM costs like for like (default vs default, best vs best, per decode "
            f"size): the summary and 'What the VM costs' of {', '.join(v.label for v in vms)}."
            + (" The metrics below compare each variant's own setting on both sides, under "
               "which NCCL chooses differently in the guest (it sees a flat tree)." if rows else "")))
    if rows:
        cols = ["metric", views[0].label]
        for v in views[1:]:
            cols += [v.label, "vs first"]
        sec.blocks.append(Table("metrics in every bundle (pcieprof compare names)", cols, rows))
    return sec if sec.blocks else None
