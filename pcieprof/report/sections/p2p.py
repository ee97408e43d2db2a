"""P2P copies: bandwidth and latency heatmaps for both paths (p2p, host_staged) and their ratio."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text
from pcieprof.units import size_label
from pcieprof.report.model import BundleView, Note, Section, Table
from pcieprof.analysis.matrices import gpu_indices, pair_matrix, pair_status

PATH_NAMES = {"p2p": "P2P (peer access on: direct DMA)",
              "host_staged": "host-staged (peer access off: through pinned host memory)"}


def _heatmap(m: np.ndarray, gpus: list[int], status: dict[tuple[int, int], str], *,
             unit: str, colorscale: str, reverse: bool = False) -> go.Figure:
    labels = [f"GPU{g}" for g in gpus]
    text = []
    for i, s in enumerate(gpus):
        row = []
        for j, d in enumerate(gpus):
            if s == d:
                row.append("X")
            elif (s, d) in status and np.isnan(m[i, j]):
                row.append(plot_text(status[(s, d)]))
            elif np.isnan(m[i, j]):
                row.append("")
            else:
                row.append(f"{m[i, j]:.3g}")
        text.append(row)
    # A near-uniform matrix (a model's, or a quiet box) must not paint rounding noise as contrast:
    # keep the colour range at least 2% of the values wide.
    span: dict[str, float] = {}
    if np.isfinite(m).any():
        lo, hi = float(np.nanmin(m)), float(np.nanmax(m))
        pad = max(0.0, 0.02 * max(abs(lo), abs(hi)) - (hi - lo)) / 2
        if pad > 0:
            span = {"zmin": lo - pad, "zmax": hi + pad}
    fig = go.Figure(go.Heatmap(
        z=m, x=labels, y=labels, text=text, texttemplate="%{text}", colorscale=colorscale,
        reversescale=reverse, colorbar={"title": {"text": unit}}, **span,
        hovertemplate="src %{y} -> dst %{x}<br>%{z:.4g} " + unit + "<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="src")
    fig.update_xaxes(title="dst", side="bottom")
    return fig


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    """The P2P section, or None when the bundle has no pairwise copies."""
    df = view.table("p2p")
    pairs = df[df["path"].isin(["p2p", "host_staged"])]
    if pairs.empty:
        return None
    gpus = gpu_indices(pairs)
    sec = Section("p2p", "P2P copies between GPUs")
    mats: dict[tuple[str, str], np.ndarray] = {}
    for path in ("p2p", "host_staged"):
        rows = pairs[pairs["path"] == path]
        if rows.empty:
            sec.blocks.append(Note(f"{PATH_NAMES[path]}: not measured", level="missing"))
            continue
        prov = view.provenance("p2p", rows)
        status = pair_status(pairs, path=path, gpus=gpus)
        bw = pair_matrix(pairs, path=path, metric="bandwidth_gbps", gpus=gpus)
        lat = pair_matrix(pairs, path=path, metric="latency_us", gpus=gpus)
        mats[(path, "bw")], mats[(path, "lat")] = bw, lat
        if not np.isnan(bw).all():
            size = int(rows[rows["bandwidth_gbps"].notna()]["size_bytes"].max())
            sec.blocks.append(figure(
                _heatmap(bw, gpus, status, unit="GB/s", colorscale="Viridis"),
                f"{path}: unidirectional bandwidth, GB/s "
                f"({size_label(size) + ' copies' if size > 0 else 'copy size not recorded'})", prov))
        else:
            sec.blocks.append(Note(f"{path}: bandwidth not measured", level="missing"))
        if not np.isnan(lat).all():
            sec.blocks.append(figure(
                _heatmap(lat, gpus, status, unit="us", colorscale="Viridis", reverse=True),
                f"{path}: latency, us (small copies, median)", prov))
        else:
            sec.blocks.append(Note(f"{path}: latency not measured", level="missing"))
        if status:
            bad = ", ".join(f"{s}->{d}: {v}" for (s, d), v in sorted(status.items()))
            sec.blocks.append(Note(f"{path} pairs not ok ({bad}); an `error` means the copied "
                                   f"bytes did not match, which is not bandwidth", level="warn"))
    if ("p2p", "bw") in mats and ("host_staged", "bw") in mats:
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = mats[("p2p", "bw")] / mats[("host_staged", "bw")]
        if not np.isnan(ratio).all():
            sec.blocks.append(figure(
                _heatmap(ratio, gpus, {}, unit="x", colorscale="RdBu"),
                "bandwidth ratio p2p / host_staged (above 1: direct P2P is faster)",
                view.provenance("p2p", pairs)))
    bi = pairs[(pairs["direction"] == "bi") & pairs["bandwidth_gbps"].notna()]
    if not bi.empty:
        m = pair_matrix(pairs, path="p2p", metric="bandwidth_gbps", direction="bi", gpus=gpus)
        if not np.isnan(m).all():
            sec.blocks.append(figure(_heatmap(m, gpus, {}, unit="GB/s", colorscale="Viridis"),
                                     "p2p: bidirectional bandwidth, GB/s",
                                     view.provenance("p2p", bi)))
    host = df[df["path"].isin(["h2d", "d2h"]) & df["bandwidth_gbps"].notna()]
    if not host.empty:
        rows = []
        for (gpu, path), g in host.assign(gpu=host[["src", "dst"]].max(axis=1)).groupby(["gpu", "path"]):
            rows.append([f"GPU{int(gpu)}", path, round(float(g["bandwidth_gbps"].median()), 2)])
        sec.blocks.append(Table("host <-> device bandwidth", ["gpu", "path", "GB/s"], rows,
                                provenance=view.provenance("p2p", host)))
    return sec

