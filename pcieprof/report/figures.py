"""Shared figure helpers: one look for every plot, provenance in every title, text made safe.

Plotly renders a subset of HTML inside titles and labels, so every string that comes from a
bundle goes through `plot_text` (HTML-escaped: `<script>` shows as text, never as markup).
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from pcieprof.report.model import Figure

#: Plotly figure config: no mode bar link to plotly's cloud, responsive to the page width.
CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True,
                          "modeBarButtonsToRemove": ["sendDataToCloud"]}


def plot_text(value: Any) -> str:
    """A bundle string made safe for plotly titles, labels and hover text."""
    return html.escape(str(value), quote=True)


def figure(fig: go.Figure, title: str, provenance: str, *, height: int = 380) -> Figure:
    """Render `fig` as a report Figure whose title carries its provenance.

    Args:
        fig: the plotly figure (traces only; the layout is set here).
        title: plain-text title (escaped here).
        provenance: e.g. "measured, backend cuda" (escaped here).
        height: pixels.
    """
    fig.update_layout(
        title={"text": f"{plot_text(title)}<br><sup>{plot_text(provenance)}</sup>",
               "x": 0.01, "xanchor": "left"},
        template="plotly_white", height=height, margin={"l": 60, "r": 20, "t": 70, "b": 50},
        font={"size": 12}, legend={"font": {"size": 11}},
    )
    div = pio.to_html(fig, include_plotlyjs=False, full_html=False, config=CONFIG,
                      default_width="100%", default_height=f"{height}px")
    return Figure(title=title, html=div, provenance=provenance)
