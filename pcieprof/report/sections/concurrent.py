"""Concurrent copies: aggregate and per-flow bandwidth per pattern, writes vs reads, and whether
each measurement's flows were released together (pcieprof.analysis.concurrent_release)."""

from __future__ import annotations

import plotly.graph_objects as go

from pcieprof.analysis.concurrent_release import Release, not_together_sentence, releases
from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text
from pcieprof.report.model import Block, BundleView, Note, Section, Table
from pcieprof.units import size_label


def _us(v: float | None) -> str:
    return "not recorded" if v is None else f"{v:.1f}"


def release_blocks(rel: list[Release], provenance: str) -> list[Block]:
    """The release table of the measurements whose bandwidth the section shows, and what it means.
    """
    if all(r.backend == "sim" for r in rel):  # the model prices every flow as running at once
        return []
    out: list[Block] = [Table(
        "how each concurrent measurement's flows were released",
        ["pattern/op", "size", "flows", "released together", "release", "start skew, us",
         "anchor lag bound, us", "all flows at once, % of span"],
        [[r.name, size_label(r.size_bytes), r.flows, r.together_text(), r.how(),
          _us(r.start_skew_us), "-" if r.release == "barrier" else _us(r.lag_bound_us),
          "not recorded" if r.overlap is None else f"{r.overlap * 100:.0f}"] for r in rel],
        provenance=provenance,
        caption="released together: every stream held by one release (the host flag every GPU "
                "waits on, or the gate event) until all copies were queued. Start skew: the "
                "latest flow's first copy after the earliest's, each timed from its GPU's "
                "anchor; anchors lie within the lag bound of the host's write, so the true skew "
                "is within that bound of the measured one (gate event: anchors assumed "
                "simultaneous; cpu: one clock, no anchors). All flows at once: the share of the "
                "span the aggregate divides by during which every flow was copying.")]
    if sentence := not_together_sentence(rel):
        out.append(Note(sentence, "warn"))
    if all(not r.release and r.backend != "sim" for r in rel):
        out.append(Note("how the flows were released is not recorded in this bundle (written "
                        "before pcieprof recorded it, or imported): whether its concurrent "
                        "numbers ran their flows at once is unknown", "missing"))
    return out


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
    if not agg.empty:
        sec.blocks += release_blocks(releases(view.bundle), view.provenance("concurrent", agg))
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        sec.blocks.append(Note(f"{len(bad)} concurrent row(s) not ok: "
                               + ", ".join(sorted({f'{p} {s}' for p, s in zip(bad['pattern'], bad['status'])})[:8]), "warn"))
    return sec
