"""Decode attribution: per-step comm/compute/idle, per rank, skew, and trace vs analytic model.

Reads attribution.json (written by `pcieprof attribute` and serve-bench) and, when the bundle has
it, comm_model.json (`pcieprof attribute --model --topology`): the report draws both as saved.
"""

from __future__ import annotations


import plotly.graph_objects as go

from pcieprof.bundle.attribution import Attribution, StepAttribution
from pcieprof.bundle.comm_model import CommModel
from pcieprof.bundle.document import encode
from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure
from pcieprof.report.model import Block, BundleView, Note, Section, Table

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
    model = view.doc(CommModel)
    if doc is None and model is None:
        return None
    prov = view.provenance("attribution" if doc is not None else "comm_model")
    sec = Section("attribution", "Decode attribution (where each step's time goes)")
    ranks = doc.ranks if doc else []
    steps = doc.steps if doc else []
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
        skew = [(r.rank, r.skew) for r in ranks if r.skew is not None]
        if skew:
            fig = go.Figure()
            fig.add_trace(go.Bar(x=[f"rank {k}" for k, _ in skew],
                                 y=[s.transfer_us / 1e3 for _, s in skew], name="transfer"))
            fig.add_trace(go.Bar(x=[f"rank {k}" for k, _ in skew],
                                 y=[s.wait_us / 1e3 for _, s in skew], name="wait for slower ranks"))
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
    if model is None or not model.table:
        sec.blocks.append(Note(
            "trace vs analytic model: not shown; `pcieprof attribute TRACES --model CARD "
            "--topology TOPOLOGY_BUNDLE` prices the card's collectives with an all-reduce curve "
            f"measured on the trace's backend ({_trace_backend(view)}) and saves comm_model.json",
            "missing"))
    else:
        sec.blocks.extend(_comparison(model, prov))
    classes = [encode(c) for c in doc.classes[:60]] if doc else []
    if classes:
        sec.blocks.append(Table("kernel classification table (data, extensible)",
                                list(classes[0]), [list(c.values()) for c in classes]))
    return sec


def _trace_backend(view: BundleView) -> str:
    part = view.bundle.part("attribution") or view.bundle.part("serve")
    return str(part and part.backend or view.bundle.backend)


def _comparison(model: CommModel, prov: str) -> list[Block]:
    """comm_model.json as saved: the table, and a warning per batch where the trace and the
    model differ by more than a quarter."""
    rows = model.table
    cols = ["batch", "layout", "n_collectives", "measured_step_ms", "predicted_comm_ms",
            "trace_comm_ms", "exposed_comm_ms", "disagreement_pct"]
    first = rows[0]
    out: list[Block] = [Table(
        f"trace vs analytic model (predicted = collectives x the all-reduce curve of "
        f"{model.topology or first.priced_source})", cols,
        [[(round(v, 3) if isinstance(v := getattr(r, c), float) else v) for c in cols]
         for r in rows],
        provenance=f"{prov}; predicted from {first.priced_source}, backend {first.priced_backend}")]
    for r in rows:
        if r.disagreement_pct is not None and abs(r.disagreement_pct) > 25:
            out.append(Note(f"batch {r.batch}: the trace's communication differs from the model "
                            f"by {r.disagreement_pct:+.0f}%", "warn"))
    return out
