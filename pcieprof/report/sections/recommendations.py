"""Recommendations with their evidence, the searched ring, and the parallel layouts."""

from __future__ import annotations

import plotly.graph_objects as go

from pcieprof.analysis.infer import value_text
from pcieprof.analysis.provenance import obtained
from pcieprof.bundle.recommendations import SCORE_SCALE, LayoutAdvice, LayoutPoint, Recommendation
from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text
from pcieprof.report.model import BundleView, Facts, Note, Section, Table
from pcieprof.report.recs import RecsBlock


def _layout_figure(layouts: list[LayoutAdvice], prov: str):
    """Predicted tok/s of each layout over the concurrencies its GPU memory holds; a layout that
    does not fit at all is named in the title, not drawn (it serves nothing)."""
    fig = go.Figure()
    for lay in layouts:
        rows = [r for r in lay.per_concurrency if lay.fits and r.fits]
        if not rows:
            continue
        fig.add_trace(go.Scatter(
            x=[r.concurrency for r in rows], y=[r.tok_s for r in rows],
            mode="lines+markers", name=plot_text(
                f"{lay.label} (up to c={lay.concurrency_text()})" if lay.gpu_memory_gib > 0
                else f"{lay.label} (fit not checked)")))
    fig.update_xaxes(type="log", title="concurrency (requests decoding together)",
                     tickvals=[1, 2, 4, 8, 16, 32, 64])
    fig.update_yaxes(title="output tok/s (predicted)")
    out = [lay.label for lay in layouts if not lay.fits]
    title = "predicted decode throughput per parallel layout, where its KV cache fits"
    if out:
        title += f"; not drawn, does not fit: {', '.join(out)}"
    return figure(fig, title, prov)


def _peak(lay: LayoutAdvice) -> LayoutPoint | None:
    """The point at the highest concurrency whose KV cache fits, or None."""
    fit = [r for r in lay.per_concurrency if r.fits] if lay.fits else []
    return fit[-1] if fit else None


def _num(x: float | None, digits: int) -> str:
    """A number with `digits` decimals; empty when unknown (null in the document)."""
    return "" if x is None or x != x else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x * 100:+.0f}%"


def _verified_table(recs: list[Recommendation]) -> Table:
    """`recommend --verify`: predicted vs re-run time at batch 1 and the gains over the band."""
    rows = []
    for r in recs:
        v = r.verified or {}
        rows.append([r.rule, v.get("provenance", ""),
                     "" if v.get("predicted_time_us") is None else f"{v['predicted_time_us']:.1f}",
                     "" if v.get("baseline_time_us") is None else f"{v['baseline_time_us']:.1f}",
                     "" if v.get("time_us") is None else f"{v['time_us']:.1f}",
                     _pct(v.get("predicted_gain_fraction")), _pct(v.get("gain_fraction")),
                     _pct(v.get("band_gain_fraction")), _pct(v.get("large_gain_fraction")),
                     v.get("note", "")])
    first = recs[0].verified or {}
    size = first.get("size_bytes", 0)
    return Table(f"verified by re-running the all-reduce ({size / 1024:g} KiB = batch "
                 f"{first.get('batch', 1)}; bundle {first.get('bundle', '')})",
                 ["recommendation", "verified with", "predicted us", "baseline us", "with it us",
                  "predicted gain (band mean)", "gain at batch 1", "gain over band",
                  "gain large message", "note"], rows,
                 provenance="; ".join(sorted({(r.verified or {}).get("provenance", "") for r in recs})))


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    doc = ctx.recommendations_for(view)
    if not doc:
        return None
    sec = Section("recommendations", "Recommendations")
    prov = doc.provenance
    sec.blocks.append(Note(f"Highest score first ({SCORE_SCALE})."))
    sec.blocks.append(RecsBlock(items=doc.recommendations, needs_measuring=doc.needs_measuring))
    verified = [r for r in doc.recommendations if r.verified]
    if verified:
        sec.blocks.append(_verified_table(verified))
    ring = doc.ring
    inferred = doc.inferred
    if ring:
        sec.blocks.append(Facts("ring search", [
            ("ring", " -> ".join(map(str, ring.order))),
            # as a list only: CUDA_VISIBLE_DEVICES in this order renumbers the ranks, it does not
            # make NCCL run this ring (the graph file does)
            ("as a device list", ring.cuda_visible_devices),
            ("slowest link", f"{ring.bottleneck_gbps:.1f} GB/s"),
            ("summed link latency", "not measured" if ring.latency_sum_us is None
             else f"{ring.latency_sum_us:.2f} us"),
            ("search", "exhaustive" if ring.exact else f"heuristic, gap <= {(ring.gap or 0) * 100:.1f}%")],
            provenance=prov))
    if inferred:
        unit = "GB/s" if "gbps" in inferred["metric"] else "us"
        sec.blocks.append(Table(f"inferred fabric (from the {obtained(view.bundle.backend)} P2P matrices, else the topology's levels)",
                                ["level", "nvidia-smi level", "GPU groups", "typical pair"],
                                [[lv["name"], lv["smi_level"],
                                  " | ".join(",".join(map(str, g)) for g in lv["groups"]),
                                  value_text(lv["value"], unit)] for lv in inferred["levels"]],
                                provenance=f"{prov}; metric {inferred['metric']}"))
        if inferred.get("hidden_structure"):
            sec.blocks.append(Note(f"the {obtained(view.bundle.backend)} structure is finer than "
                                   "the PCIe tree this machine shows: the switches are hidden "
                                   "(flat virtual tree)", "warn"))
    layouts = doc.layouts
    if layouts:
        lprov = f"predicted: compute {layouts[0].compute_source}; comm {layouts[0].comm_source}"
        sec.blocks.append(_layout_figure(layouts, lprov))
        rows = []
        for lay in layouts:
            pc = {r.concurrency: r for r in lay.per_concurrency}
            c1, peak = pc.get(1), _peak(lay)
            known = lay.gpu_memory_gib > 0  # unknown memory: the fit was not checked
            fits = ("uncertain" if lay.fit_uncertain else "yes" if lay.fits else "no")
            rows.append([lay.label, fits if known else "not checked",
                         f"{lay.weights_gib:.1f}", f"{lay.kv_gib_per_request:.2f}",
                         lay.concurrency_text() if known else "",
                         _num(c1.step_ms if c1 and lay.fits else None, 1),
                         _num(c1.comm_ms if c1 and lay.fits else None, 1),
                         f"{_num(peak.tok_s, 0)} at c={peak.concurrency}" if peak else ""])
        sec.blocks.append(Table(
            "parallel layouts, " + ("not ranked (fitting first, in a fixed order)" if doc.layouts_unranked
                                    else "best first")
            + f" (context {layouts[0].context_tokens} tokens, "
            + (f"{layouts[0].memory_text()} x {layouts[0].mem_fraction} per GPU"
               + (f" ({layouts[0].memory_source})" if layouts[0].memory_assumed() else "")
               if layouts[0].gpu_memory_gib > 0 else "GPU memory unknown: fit not checked")
            + ")",
            ["layout", "fits", "weights GiB/GPU", "KV GiB/request", "max concurrency",
             "step ms c=1", "comm ms c=1", "tok/s at its highest fitting concurrency"],
            rows, provenance=lprov, caption=doc.layouts_unranked or layouts[0].why))
        # A command is a paragraph: folded in its own table, the numbers above stay one line a row.
        sec.blocks.append(Table("SGLang command per layout that fits", ["layout", "SGLang command"],
                                [[lay.label, lay.command] for lay in layouts if lay.fits],
                                provenance="predicted: the layouts of the table above",
                                collapsed=True))
        notes = sorted({n for lay in layouts for n in lay.notes})
        for n in notes:
            sec.blocks.append(Note(n, "missing"))
    return sec
