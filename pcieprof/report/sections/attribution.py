"""Decode attribution: per-step comm/compute/idle, per rank, skew, and trace vs analytic model.

Reads attribution.json (written by `pcieprof attribute`); the analytic side comes from
pcieprof.analysis.comm_model.comparison_table priced with this bundle's all-reduce curves.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from pcieprof.analysis.comm_model import Layout, Pricer, comparison_table
from pcieprof.bundle.attribution import Attribution, StepAttribution
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.cards import load_card
from pcieprof.errors import PcieprofError
from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure
from pcieprof.report.model import BundleView, Note, Section, Table

MAX_STEPS = 300


def _steps_figure(steps: list[StepAttribution], rank: int, prov: str):
    steps = [s for s in steps if s.rank == rank][:MAX_STEPS]
    x = list(range(len(steps)))
    fig = go.Figure()
    parts = (("compute_us", "compute", "#4c78a8"), ("exposed_comm_us", "exposed communication", "#e45756"),
             ("memory_us", "memory copies", "#72b7b2"), ("idle_us", "idle", "#bab0ac"))
    for key, name, color in parts:
        fig.add_trace(go.Bar(x=x, y=[(getattr(s, key) or 0) / 1e3 for s in steps], name=name,
                             marker_color=color))
    fig.update_layout(barmode="stack", bargap=0.05)
    fig.update_xaxes(title="step (in trace order)")
    fig.update_yaxes(title="ms")
    return figure(fig, f"per-step decode time, rank {rank}: compute, exposed comm, copies, idle", prov)


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    doc = view.doc(Attribution)
    if doc is None:
        return None
    prov = view.provenance("attribution")
    sec = Section("attribution", "Decode attribution (where each step's time goes)")
    ranks = doc.ranks
    steps = doc.steps
    if ranks:
        fig = go.Figure()
        names = [f"rank {r.rank}" for r in ranks]
        for key, name in (("compute_us", "compute"), ("comm_us", "communication"),
                          ("exposed_comm_us", "exposed comm"), ("memory_us", "memory"),
                          ("idle_us", "idle")):
            vals = [(r.totals.get(key) or 0) / 1e3 for r in ranks]
            if any(vals):
                fig.add_trace(go.Bar(x=names, y=vals, name=name))
        fig.update_layout(barmode="group")
        fig.update_yaxes(title="ms (union over the timeline)")
        sec.blocks.append(figure(fig, "per rank: time per class over the traced window", prov))
        skew = [(r.rank, r.skew or {}) for r in ranks]
        if any(s for _, s in skew):
            fig = go.Figure()
            fig.add_trace(go.Bar(x=[f"rank {k}" for k, _ in skew],
                                 y=[(s.get("transfer_us") or 0) / 1e3 for _, s in skew], name="transfer"))
            fig.add_trace(go.Bar(x=[f"rank {k}" for k, _ in skew],
                                 y=[(s.get("wait_us") or 0) / 1e3 for _, s in skew], name="wait for slower ranks"))
            fig.update_layout(barmode="stack")
            fig.update_yaxes(title="ms inside communication kernels")
            sec.blocks.append(figure(fig, "skew: communication time split into transfer and waiting", prov))
        rows = []
        for r in ranks:
            d = r.decode_steps or {}
            rows.append([r.rank, r.mode, r.n_steps, d.get("n"),
                         round((d.get("median_span_us") or 0) / 1e3, 3),
                         round((d.get("mean_comm_us") or 0) / 1e3, 3),
                         round((d.get("mean_exposed_comm_us") or 0) / 1e3, 3),
                         round((d.get("mean_compute_us") or 0) / 1e3, 3),
                         round((d.get("mean_idle_us") or 0) / 1e3, 3)])
        sec.blocks.append(Table("decode steps per rank (means, ms)",
                                ["rank", "timeline", "steps", "decode steps", "median step",
                                 "comm", "exposed comm", "compute", "idle"], rows, provenance=prov))
    if steps:
        sec.blocks.append(_steps_figure(steps, steps[0].rank, prov))
    pricer = _pricing_bundle(view, ctx)
    cmp_rows: list[dict[str, Any]] = []
    if pricer is not None:
        try:
            cmp_rows = _comparison(view, doc, pricer)
        except PcieprofError as exc:
            sec.blocks.append(Note(f"trace vs analytic model: not shown: {exc.one_line()}",
                                   "missing"))
    if pricer is None:
        sec.blocks.append(Note(
            f"trace vs analytic model: not shown; it needs an all-reduce curve measured on the "
            f"same backend as the trace ({_trace_backend(view)}): report this bundle together "
            f"with a pcieprof topology bundle of that backend", "missing"))
    if cmp_rows and pricer is not None:
        cols = ["batch", "layout", "n_collectives", "measured_step_ms", "predicted_comm_ms",
                "trace_comm_ms", "exposed_comm_ms", "disagreement_pct"]
        sec.blocks.append(Table(
            "trace vs analytic model (predicted = collectives x the all-reduce curve of "
            + ("this bundle" if pricer is view else pricer.label) + ")",
            cols, [[(round(r[c], 3) if isinstance(r.get(c), float) else r.get(c)) for c in cols]
                   for r in cmp_rows],
            provenance=f"{prov}; predicted from {cmp_rows[0].get('priced_source')}, backend "
                       f"{cmp_rows[0].get('priced_backend')}"))
        big = [c for c in cmp_rows if c.get("disagreement_pct") is not None
               and abs(c["disagreement_pct"]) > 25]
        for c in big:
            sec.blocks.append(Note(f"batch {c['batch']}: the trace's communication differs from the "
                                   f"model by {c['disagreement_pct']:+.0f}%", "warn"))
    classes = doc.classes
    if classes:
        sec.blocks.append(Table("kernel classification table (data, extensible)",
                                list(classes[0].keys()), [list(c.values()) for c in classes[:60]]))
    return sec


def _trace_backend(view: BundleView) -> str:
    part = view.bundle.part("attribution") or view.bundle.part("serve")
    return str(part.get("backend") or view.bundle.backend)


def _pricing_bundle(view: BundleView, ctx: ReportContext) -> BundleView | None:
    """This bundle when it has all-reduce rows, else another bundle of the report measured on
    the same backend (a gloo trace is priced with gloo curves, never with GPU ones)."""
    if not view.table("allreduce").empty:
        return view
    want = _trace_backend(view)
    for other in ctx.views:
        ar = other.table("allreduce")
        if other is not view and not ar.empty and set(ar["backend"].astype(str)) == {want}:
            return other
    return None


def _comparison(view: BundleView, doc: Attribution, pricer: BundleView) -> list[dict[str, Any]]:
    """The trace-vs-analytic comparison table, priced with `pricer`'s all-reduce curves, for the
    model the serve-bench run served ([] when the bundle names none)."""
    summary = view.doc(ServeSummary)
    card_name = summary.model if summary else (view.json("serve/card.json") or {}).get("name")
    if not card_name:
        return []
    rec = view.bundle.model()  # the served card as recorded: a config.json card has no shipped name
    card = load_card(rec.ref if rec is not None and rec.name == card_name else card_name)
    batches = sorted({int(s.bs) for s in doc.steps if s.bs}) or [1]
    tp = max(1, len(doc.ranks))
    return comparison_table(card, Layout(tp=tp), batches[:8], Pricer(pricer.bundle),
                            serve_bundle=view.bundle, attribution=doc)
