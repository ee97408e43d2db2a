"""The first screen: the principal bottleneck and the top recommendations with their gains."""

from __future__ import annotations

from pcieprof.bundle.attribution import Attribution
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Note, Section
from pcieprof.report.recs import RecsBlock
from pcieprof.report.sections.vm import vm_verdict

TOP = 3


def decode_headline(view: BundleView) -> str | None:
    """'Decode steps (trace, ...): communication 47% of the step, exposed 46%, idle 1%' from the
    share attribution.json saved (pcieprof.analysis.decode_share), if any."""
    doc = view.doc(Attribution)
    share = doc.decode_share if doc else None
    if share is None or not share.span_us:
        return None
    return (f"Decode steps (trace, {share.steps} steps over {share.ranks} rank(s)): "
            f"communication {share.comm_pct:.0f}% of the step, exposed "
            f"{share.pct(share.exposed_comm_us):.0f}%, idle {share.pct(share.idle_us):.0f}% "
            f"[{view.provenance('attribution')}]")


def serve_headline(view: BundleView) -> str | None:
    """Best measured output throughput and its TPOT from serve/summary.json, if any."""
    summary = view.doc(ServeSummary)
    runs = [r for r in summary.runs if r.output_throughput] if summary else []
    if not runs:
        return None
    best = max(runs, key=lambda r: r.output_throughput or 0.0)
    tpot = best.tpot_ms.get("median")
    return (f"Serving: {best.output_throughput:.1f} output tok/s at {best.label}"
            + (f", TPOT median {tpot:.1f} ms" if tpot else "") + f" [{view.provenance('serve')}]")


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    """Summary from the tuner's output as saved (recommendations.json)."""
    doc = ctx.recommendations_for(view)
    lines = [x for x in (serve_headline(view), decode_headline(view)) if x]
    unsaved = ctx.unsaved_why(view)
    if not doc:
        if not lines and unsaved is None:
            return None
        sec = Section("summary", "Summary")
        for i, line in enumerate(lines):
            sec.blocks.append(Note(line, "headline" if i == 0 else "info"))
        sec.blocks.append(Note(f"no recommendations: {unsaved}", "warn") if unsaved is not None
                          else Note("no P2P or all-reduce measurements in this bundle: no "
                                    "tuning advice (run pcieprof topology)", "missing"))
        return sec
    sec = Section("summary", "Summary")
    for line in lines:
        sec.blocks.append(Note(line))
    sec.blocks.append(Note(f"Principal bottleneck: {doc.bottleneck or 'unknown'}", "headline"))
    vm = vm_verdict(view, ctx)
    if vm is not None:
        sec.blocks.append(vm)
    recs = [r for r in doc.recommendations if r.kind != "info"][:TOP]
    if recs:
        sec.blocks.append(Note(f"Top {len(recs)} change(s), highest score first (each card says "
                               f"how it was scored; numbers: {doc.provenance}):"))
        sec.blocks.append(RecsBlock(items=recs, needs_measuring=[], compact=True))
    else:
        sec.blocks.append(Note("No change is supported by the measurements in this bundle."))
    if doc.layouts_unranked:
        sec.blocks.append(Note(f"Parallel layouts {doc.layouts_unranked}", "missing"))
    elif doc.layouts:
        top = doc.layouts[0]
        sec.blocks.append(Note(f"Best parallel layout: {top.why or top.label}"))
    if doc.needs_measuring:
        sec.blocks.append(Note(f"{len(doc.needs_measuring)} question(s) need more measurements "
                               f"(see Recommendations)", "missing"))
    return sec
