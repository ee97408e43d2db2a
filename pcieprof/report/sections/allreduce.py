"""All-reduce sweeps: latency and busbw per variant, the decode-message band marked."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from pcieprof.analysis.curves import EXTRAPOLATED, Curve, Curves
from pcieprof.analysis.nodes import Nodes
from pcieprof.bundle.rows import format_ranks
from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text
from pcieprof.units import size_label
from pcieprof.report.model import BundleView, Note, Section, Table

_TICKS = [8, 1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20, 1 << 30]


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that measured something: status ok and a time."""
    return df[(df["status"] == "ok") & df["time_us"].notna()]


def full_group(df: pd.DataFrame) -> pd.DataFrame:
    """Rows over the largest group (all GPUs), any ring order."""
    if df.empty:
        return df
    return df[df["nranks"] == df["nranks"].max()]


def _curve_fig(rows: pd.DataFrame, y: str, ctx: ReportContext, *, log_y: bool) -> go.Figure:
    if rows["dtype"].nunique() > 1 and (rows["dtype"] == "bf16").any():
        rows = rows[rows["dtype"] == "bf16"]  # decode all-reduces are bf16; fp32 is in the table
    fig = go.Figure()
    for (variant, ranks, dtype), g in rows.groupby(["variant", "ranks", "dtype"], sort=True):
        g = g.groupby("size_bytes", as_index=False)[y].median().sort_values("size_bytes")
        name = (f"{variant} [{format_ranks(ranks)}] {dtype}" if rows["ranks"].nunique() > 1
                else f"{variant} {dtype}")
        fig.add_trace(go.Scatter(
            x=g["size_bytes"], y=g[y], mode="lines+markers", name=plot_text(name),
            hovertemplate="%{x:.3s}B: %{y:.4g}<extra>" + plot_text(name) + "</extra>"))
    band = ctx.band
    fig.add_vrect(x0=band.lo_bytes, x1=band.hi_bytes, fillcolor="orange", opacity=0.15,
                  line_width=0, annotation_text=plot_text(f"decode band {size_label(band.lo_bytes)}"
                                                          f"..{size_label(band.hi_bytes)}"),
                  annotation_position="top left")
    fig.update_xaxes(type="log", title="message size (bytes)", tickvals=_TICKS,
                     ticktext=[size_label(t) for t in _TICKS])
    fig.update_yaxes(type="log" if log_y else "linear")
    return fig


def decode_table(curves: list[Curve], ctx: ReportContext,
                 nodes: Nodes | None = None) -> Table | None:
    """Time per curve at the decode band's batches (pcieprof.analysis.curves' rule; a value
    above the largest measured size is marked as extrapolated); a multi-node bundle's groups
    say whether they cross nodes."""
    if not curves:
        return None
    batches = ctx.band.batches
    cols = ["variant", "ranks", "dtype"] + [f"bs{b} ({size_label(ctx.band.message_bytes(b))}) us"
                                             for b in batches]
    out = []
    for c in curves:
        vals: list[object] = []
        for b in batches:
            size = ctx.band.message_bytes(b)
            t = c.at(size)
            if not math.isfinite(t):
                vals.append("not measured")
            elif c.extent(size) == EXTRAPOLATED:
                vals.append(f"{t:.2f} (extrapolated)")
            else:
                vals.append(round(t, 2))
        group = format_ranks(c.ranks) + (f" ({nodes.group(c.ranks)})" if nodes else "")
        out.append([c.variant, group, c.dtype, *vals])
    return Table("all-reduce time at decode message sizes, us (log-log interpolation between "
                 "the sweep's sizes)", cols, out)


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    """The all-reduce section, or None when the bundle has no all-reduce rows."""
    df = view.table("allreduce")
    if df.empty:
        return None
    sec = Section("allreduce", "All-reduce")
    rows = ok_rows(df)
    full = full_group(rows)
    curves = Curves(df)
    several = Nodes.of(view.bundle)
    if several is not None:
        sec.blocks.append(Note(f"{several.describe()}: the groups over every node are inter-node "
                               f"(transport: {several.transport}); `ranks` are global GPU "
                               f"numbers, node x {several.layout.stride} + device"))
    if full.empty:
        sec.blocks.append(Note("no all-reduce completed (every row failed or hung)", "warn"))
    else:
        n = int(full["nranks"].max())
        who = (several.group(full["ranks"].iloc[0]) if several is not None else f"{n} ranks")
        prov = view.provenance("allreduce", full)
        sec.blocks.append(figure(_curve_fig(full, "time_us", ctx, log_y=True),
                                 f"all-reduce latency over {who}, us, per variant", prov))
        sec.blocks.append(figure(_curve_fig(full, "busbw_gbps", ctx, log_y=False),
                                 f"all-reduce busbw over {who}, GB/s (nccl-tests: "
                                 f"algbw x 2(n-1)/n)", prov))
        t = decode_table(curves.full_group(), ctx, several)
        if t:
            t.provenance = prov
            sec.blocks.append(t)
    sub = rows[rows["nranks"] < (rows["nranks"].max() if not rows.empty else 0)]
    if not sub.empty:
        t = decode_table([c for c in curves if c.nranks < curves.max_nranks], ctx, several)
        if t:
            t.title = ("sub-group all-reduce time at decode sizes (pairs, TP4 groups, orders)"
                       if several is None else "intra-node and sub-group all-reduce time at "
                       "decode sizes (node 0's own GPUs; pairs, TP4 groups across the nodes)")
            t.provenance = view.provenance("allreduce", sub)
            sec.blocks.append(t)
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        summary = bad.groupby(["variant", "ranks", "status"]).agg(
            n=("size_bytes", "size"), first_size=("size_bytes", "min"),
            detail=("detail", "first")).reset_index()
        summary["ranks"] = [format_ranks(r) for r in summary["ranks"]]
        sec.blocks.append(Table("all-reduce rows not ok (hang = killed by the watchdog)",
                                list(summary.columns), summary.values.tolist(),
                                provenance=view.provenance("allreduce", bad)))
    sec.blocks.append(Note(ctx.band.label()))
    return sec
