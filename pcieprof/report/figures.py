"""Shared figure helpers: one look for every plot, provenance in every title, text made safe.

A figure is kept as a compact plotly spec (plain JSON: floats rounded to 4 significant digits,
no per-figure template, no title) and drawn by the page's one loader (see `page.py`). Its title
and provenance are page text above the plot, so they wrap in a narrow column instead of being
cut off by the SVG.

Plotly renders a subset of HTML inside labels and hover text, so every string that comes from a
bundle goes through `plot_text` (HTML-escaped: `<script>` shows as text, never as markup).
"""

from __future__ import annotations

import base64
import html
import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from pcieprof.report.model import Figure

#: Significant digits kept for non-integer numbers in a figure (hover shows at most .4g).
DIGITS = 4
#: Vertical pixels the page title above a plot takes; the plot itself gets the rest.
TITLE_PX = 40
#: Plot height of a heatmap, in pixels: 8 GPUs' cells stay about 25 px square.
SQUARE_PX = 260
#: The layout every figure shares (the page puts it in its one plotly template): the title is
#: page text, so the top margin only holds the legend, laid out in rows above the plot.
LOOK: dict[str, Any] = {
    "margin": {"l": 60, "r": 16, "t": 10, "b": 46}, "font": {"size": 12},
    "legend": {"font": {"size": 11}, "orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
}


def plot_text(value: Any) -> str:
    """A bundle string made safe for plotly titles, labels and hover text."""
    return html.escape(str(value), quote=True)


def figure(fig: go.Figure, title: str, provenance: str, *, height: int = 300) -> Figure:
    """A report Figure of `fig`, its title and provenance shown as page text above it.

    Args:
        fig: the plotly figure (traces and axes; the look is set here).
        title: plain-text title (escaped by the page template).
        provenance: e.g. "measured, backend cuda" (escaped by the page template).
        height: pixels for title and plot together.
    """
    heatmaps = bool(fig.data) and all(t.type == "heatmap" for t in fig.data)
    if heatmaps:
        # The values are printed in the cells, so a colour bar only takes width from them.
        fig.update_traces(showscale=False, selector={"type": "heatmap"})
    # A heatmap gets one grid track (290+ px wide): about as tall as wide keeps its cells square.
    plot_px = min(height - TITLE_PX, SQUARE_PX) if heatmaps else height - TITLE_PX
    fig.update_layout(height=plot_px)
    spec = plain(fig.to_dict())
    spec["layout"].pop("template", None)  # the page holds the one template, with LOOK in it
    return Figure(title=title, spec=spec, provenance=provenance, height=plot_px,
                  shape="square" if heatmaps else "wide")


def plain(value: Any) -> Any:
    """`value` as plain JSON values: typed arrays decoded, numbers rounded, NaN as null."""
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:  # plotly's base64 typed array
            arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
            if value.get("shape"):
                arr = arr.reshape([int(s) for s in str(value["shape"]).split(",")])
            return plain(arr.tolist())
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, float):
        return round_number(value)
    return value


def round_number(x: float) -> float | int | None:
    """`x` to DIGITS significant digits; whole numbers as int; NaN and inf as None (a gap)."""
    if not math.isfinite(x):
        return None
    if not x.is_integer():
        x = float(f"{x:.{DIGITS}g}")
    return int(x) if x.is_integer() and abs(x) < 2**53 else x
