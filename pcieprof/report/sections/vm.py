"""What the VM costs: the like-for-like table against bare metal, why, and what only the host can
change (a VM bundle's column only). The verdict in words is the summary's (`vm_verdict`); the
table, its footnotes and the words come from pcieprof.analysis.vm_words, as `pcieprof compare` prints them.
"""

from __future__ import annotations

from pcieprof.analysis.virtualization import VmCost, bare_for, is_vm, known_state, like_for_like
from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Note, NoteGroup, Section, Table
from pcieprof.analysis.vm_words import host_change_gain, setting_rows, table, unknown_cost, verdict_parts
from pcieprof.units import size_label


def vm_cost(view: BundleView, ctx: ReportContext) -> VmCost | None:
    """The like-for-like table of a VM bundle: the fabric model's, or against a bare-metal
    bundle of the same report."""
    others = [v.bundle for v in ctx.views if v is not view]
    return like_for_like(view.bundle, bare_for(view.bundle, others), ctx.band)


def vm_verdict(view: BundleView, ctx: ReportContext) -> NoteGroup | Note | None:
    """The VM verdict of a VM bundle (None for bare metal): what virtualization costs like for
    like with its numbers, then (folded) the decode step, default against default, why, and what
    to do; or, without numbers, what is known and what to measure."""
    if not is_vm(view.bundle):
        return None
    cost = vm_cost(view, ctx)
    if cost is None:
        return Note(unknown_cost(known_state(view.bundle), view.label), "verdict")
    return NoteGroup([Note(s, "verdict" if i == 0 else "info")
                      for i, s in enumerate(verdict_parts(cost))])


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    if not is_vm(view.bundle):
        return None
    sec = Section("vm", "What the VM costs, like for like")
    cost = vm_cost(view, ctx)
    if cost is None:
        sec.blocks.append(Note(unknown_cost(known_state(view.bundle), view.label), "missing"))
        return sec
    cols, rows = table(cost)
    sec.blocks.append(Table(
        f"VM / bare metal, {cost.nranks}-GPU all-reduce per decode size (us) and the all-reduces of "
        f"a decode step (ms); VM +x%: the VM is slower by x%", cols, rows, provenance=cost.provenance,
        caption="; ".join(cost.notes)))
    first = size_label(cost.rows(cost.bases[0])[0].size_bytes)
    sec.blocks.append(Table(f"what each side ran at {first}", ["basis", "VM", "bare metal"],
                            setting_rows(cost), provenance=cost.provenance, collapsed=True))
    if cost.mechanisms or cost.known_issues:  # a short line, then the long texts folded
        sec.blocks.append(Note("Why, in the fabric model's words (mechanisms, known issues, "
                               "sources in the VM profile): " + "; ".join(
                                   m.title for m in cost.mechanisms.values()) + "."))
    for m in cost.mechanisms.values():
        sec.blocks.append(Note(f"{m.title}. {m.text} Sources: {'; '.join(m.sources)}."))
    for k in cost.known_issues:
        sec.blocks.append(Note(f"Known issue: {k.title}. {k.text} {k.check}"))
    if cost.host_changes:
        sec.blocks.append(Table(
            "what only the hypervisor host can change, priced by the fabric model "
            f"(the all-reduces of a {cost.model} decode step at batch {cost.batches[0]}, "
            f"{cost.step_allreduces} of them, not the whole step)", ["change", "expected (simulated)", "risk, or why it is blocked", "how"],
            [[h.title, host_change_gain(h), h.blocked_by or h.risk, h.how] for h in cost.host_changes],
            provenance=cost.provenance, collapsed=True))
    return sec
