"""The first screen: the principal bottleneck and the top recommendations with their gains."""

from __future__ import annotations

from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Note, Section
from pcieprof.report.recs import RecsBlock

TOP = 3


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    """Summary from the tuner's output (recommendations.json or computed in memory)."""
    doc = ctx.recommendations_for(view)
    if not doc:
        return None
    sec = Section("summary", "Summary")
    if doc.get("error"):
        sec.blocks.append(Note(f"the tuner could not run on this bundle: {doc['error']}", "warn"))
        return sec
    sec.blocks.append(Note(f"Principal bottleneck: {doc.get('bottleneck', 'unknown')}", "headline"))
    recs = [r for r in doc.get("recommendations", []) if r.get("kind") != "info"][:TOP]
    if recs:
        sec.blocks.append(Note(f"Top {len(recs)} change(s), most valuable first "
                               f"(numbers: {doc.get('provenance', '')}):"))
        sec.blocks.append(RecsBlock(items=recs, needs_measuring=[], compact=True))
    else:
        sec.blocks.append(Note("No change is supported by the measurements in this bundle."))
    if doc.get("layouts"):
        top = doc["layouts"][0]
        sec.blocks.append(Note(f"Best parallel layout: {top.get('why', top.get('label'))}"))
    if doc.get("needs_measuring"):
        sec.blocks.append(Note(f"{len(doc['needs_measuring'])} question(s) need more measurements "
                               f"(see Recommendations)", "missing"))
    if doc.get("computed_by_report"):
        sec.blocks.append(Note("computed by the report from this bundle; `pcieprof recommend` "
                               "writes the env file, NCCL files and SGLang command", "missing"))
    return sec
