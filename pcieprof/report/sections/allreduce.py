"""All-reduce sweeps: latency and busbw per variant, the decode-message band marked."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text, size_label
from pcieprof.report.model import BundleView, Note, Section, Table
from pcieprof.analysis.curves import Curve

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
        name = f"{variant} [{ranks}] {dtype}" if rows["ranks"].nunique() > 1 else f"{variant} {dtype}"
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


def decode_table(rows: pd.DataFrame, ctx: ReportContext) -> Table | None:
    """Time per variant at the sizes of the decode band (nearest measured size at or above)."""
    if rows.empty:
        return None
    batches = [b for b in (1, 4, 16, 64) if ctx.band.batch_min <= b <= ctx.band.batch_max]
    cols = ["variant", "ranks", "dtype"] + [f"bs{b} ({size_label(ctx.band.message_bytes(b))}) us"
                                             for b in batches]
    out = []
    for (variant, ranks, dtype), g in rows.groupby(["variant", "ranks", "dtype"], sort=True):
        curve = g.groupby("size_bytes")["time_us"].median().sort_index()
        c = Curve(variant=str(variant), env={}, nranks=0, ranks=str(ranks), backend="",
                  time_us=curve, busbw_gbps=curve * float("nan"))
        vals = []
        for b in batches:
            t = c.at(ctx.band.message_bytes(b))
            vals.append(round(t, 2) if math.isfinite(t) else "not measured")
        out.append([variant, ranks, dtype, *vals])
    return Table("all-reduce time at decode message sizes, us (log-log interpolation inside the "
                 "measured sizes)", cols, out)


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    """The all-reduce section, or None when the bundle has no all-reduce rows."""
    df = view.table("allreduce")
    if df.empty:
        return None
    sec = Section("allreduce", "All-reduce")
    rows = ok_rows(df)
    full = full_group(rows)
    if full.empty:
        sec.blocks.append(Note("no all-reduce completed (every row failed or hung)", "warn"))
    else:
        n = int(full["nranks"].max())
        prov = view.provenance("allreduce", full)
        sec.blocks.append(figure(_curve_fig(full, "time_us", ctx, log_y=True),
                                 f"all-reduce latency over {n} ranks, us, per variant", prov))
        sec.blocks.append(figure(_curve_fig(full, "busbw_gbps", ctx, log_y=False),
                                 f"all-reduce busbw over {n} ranks, GB/s (nccl-tests: "
                                 f"algbw x 2(n-1)/n)", prov))
        t = decode_table(full, ctx)
        if t:
            t.provenance = prov
            sec.blocks.append(t)
    sub = rows[rows["nranks"] < (rows["nranks"].max() if not rows.empty else 0)]
    if not sub.empty:
        t = decode_table(sub, ctx)
        if t:
            t.title = "sub-group all-reduce time at decode sizes (pairs, TP4 groups, orders)"
            t.provenance = view.provenance("allreduce", sub)
            sec.blocks.append(t)
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        summary = bad.groupby(["variant", "ranks", "status"]).agg(
            n=("size_bytes", "size"), first_size=("size_bytes", "min"),
            detail=("detail", "first")).reset_index()
        sec.blocks.append(Table("all-reduce rows not ok (hang = killed by the watchdog)",
                                list(summary.columns), summary.values.tolist(),
                                provenance=view.provenance("allreduce", bad)))
    sec.blocks.append(Note(ctx.band.label()))
    return sec
