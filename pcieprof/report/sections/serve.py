"""Serve-bench results: the launch search, latency distributions, throughput vs concurrency,
decode curve, launches.

Reads serve/search.json, serve/summary.json, serve/requests.jsonl, serve/decode_curve.csv and
serve/attempts.jsonl (written by serve-bench). The launch search (`--sweep`) is shown as its
winner, a command ready to paste, next to the table of attempts (configuration, outcome class,
the log line that decided it, time to failure). Metric names and formulas as vLLM/SGLang use
them; the formulas the run used are shown from summary.json.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go

from pcieprof.bundle.recommendations import Recommendation
from pcieprof.bundle.serve_search import ATTEMPTS_FILE, ServeSearch, read_attempts
from pcieprof.bundle.serve_summary import RunSummary, ServeSummary
from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text
from pcieprof.report.model import Block, BundleView, Facts, Note, Section, Table
from pcieprof.report.recs import RecsBlock
from pcieprof.report.sections.serve_spread import inversion_notes, tpot_note

MAX_POINTS = 4000  # per distribution trace, so a long run keeps the page light


def read_jsonl(view: BundleView, name: str) -> list[dict[str, Any]]:
    p = view.path / name
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a crash mid-write
    return out


def _stat(run: RunSummary, metric: str, key: str) -> float | None:
    v = getattr(run, metric).get(key)
    return None if v is None else round(float(v), 2)


def _secs(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}"


def search_blocks(view: BundleView, search: ServeSearch, prov: str) -> list[Block]:
    """The launch search: what it is, its winner as a command ready to paste (or why there is
    none), and the attempts table next to it."""
    results = search.results
    played = f" (playing {search.like}'s search)" if search.like else ""
    facts: list[tuple[str, object]] = [
        ("model", f"{search.card}{played}"), ("GPU architecture", search.arch),
        ("status", search.status), ("why", search.why),
        ("attempts", f"{len(results)}" + (f" (+{len(search.attempts) - len(results)} "
                                          f"interrupted, launched again)"
                                          if len(search.attempts) > len(results) else "")),
        ("time in failed launches", f"{sum(a.time_to_failure_s or 0 for a in results):.1f} s"),
        ("flags checked against", f"SGLang {search.sglang}'s parser" if search.sglang
         else "no SGLang parser")]
    if search.excluded:
        facts.append(("values excluded", ", ".join(f"{e.axis}={e.value} (attempt {e.attempt}, "
                                                   f"{e.rule})" for e in search.excluded)))
    if not search.found:
        facts.append(("axes exhausted", ", ".join(search.exhausted_axes) or "none"))
        facts.append(("axes with values never tried", ", ".join(search.open_axes) or "none"))
    out: list[Block] = [Facts("launch search (serve-bench --sweep)", facts, provenance=prov)]
    w = search.winner
    if w is not None:
        evidence = [f"{k} = {v}" for k, v in w.config.items() if v]
        if w.launch_prefix:
            evidence.append("started through: " + " ".join(w.launch_prefix))
        caveats = []
        if search.like:
            caveats.append(f"{search.card} stands in for {search.like}: its failures were "
                           f"injected by its launch flags, so this tests the search; it is "
                           f"not SGLang serving {search.like}.")
        out.append(RecsBlock(items=[Recommendation(
            rule="launch search", kind="launch",
            title=f"Healthy configuration: {w.label} (attempt {w.index})",
            action=w.command, gain_text=f"served correct tokens after {len(results) - 1} "
                                        f"failed attempt(s)",
            evidence=evidence, caveats=caveats, confidence="measured")]))
        out.append(Note(f"for the layouts' SGLang commands: pcieprof recommend TOPOLOGY_BUNDLE "
                        f"--serve {view.path} (or pcieprof report TOPOLOGY_BUNDLE {view.path})"))
    else:
        end = search.end
        hint = f"; {end.hint}" if end is not None and end.hint else ""
        resume = (f"; serve-bench --sweep --resume --out {view.path} continues it"
                  if search.status in ("running", "interrupted") else "")
        out.append(Note(f"no healthy configuration found yet ({search.status}): {search.why}"
                        f"{hint}{resume}", "warn"))
    rows = [[a.index, a.outcome, _secs(a.time_to_failure_s), a.label,
             a.deciding_line or a.summary, a.rule, _secs(a.time_to_ready_s)]
            for a in search.attempts]
    out.append(Table("launch search attempts", ["#", "class", "time to failure s",
                                                "configuration", "log line that decided it",
                                                "chosen by", "ready after s"],
                     rows, provenance=prov,
                     caption="class: how the launch ended (ok = served correct tokens); "
                             "configuration: the values set, in the search's axis order "
                             f"({', '.join(a.name for a in search.axes)}); each attempt's log "
                             "is serve/server-<#>.log"))
    return out


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    summary = view.doc(ServeSummary)
    search = view.doc(ServeSearch)
    requests = read_jsonl(view, "serve/requests.jsonl")
    path = view.path / ATTEMPTS_FILE
    attempts = read_attempts(path.read_text(encoding="utf-8", errors="replace"), str(path)) \
        if path.is_file() else []
    curve = view.table("decode_curve")
    if not (summary or search or requests or attempts or not curve.empty):
        return None
    prov = view.provenance("serve")
    sec = Section("serve", "Serving benchmark")
    if summary:
        sec.blocks.append(Facts("run", [
            ("model", summary.model), ("api", summary.api),
            ("attempt benchmarked", summary.attempt),
            ("input / output tokens", f"{summary.input_len} / {summary.output_len}"),
            ("status", summary.status)], provenance=prov))
        if summary.formulas:  # beside the facts: two short blocks share a row
            sec.blocks.append(Facts("metric definitions (as computed)",
                                    [(k, v) for k, v in summary.formulas.items() if k in
                                     ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "output_throughput")]))
    if search:
        sec.blocks.extend(search_blocks(view, search, prov))
    runs = summary.runs if summary else []
    if runs:
        rows = [[r.label, r.concurrency, r.completed, r.failed,
                 round(r.request_throughput or 0, 3), round(r.output_throughput or 0, 1),
                 _stat(r, "ttft_ms", "median"), _stat(r, "ttft_ms", "p99"),
                 _stat(r, "tpot_ms", "median"), _stat(r, "tpot_ms", "p99"),
                 _stat(r, "itl_ms", "median"), _stat(r, "itl_ms", "p99")] for r in runs]
        sec.blocks.append(Table("runs", ["run", "concurrency", "completed", "failed", "req/s",
                                         "output tok/s", "TTFT ms median", "TTFT p99",
                                         "TPOT ms median", "TPOT p99", "ITL ms median", "ITL p99"],
                                rows, provenance=prov))
        conc = [r for r in runs if r.concurrency]
        if conc:
            fig = go.Figure()
            fig.add_trace(go.Scatter(x=[r.concurrency for r in conc],
                                     y=[r.output_throughput for r in conc],
                                     mode="lines+markers", name="output tok/s"))
            fig.add_trace(go.Scatter(x=[r.concurrency for r in conc],
                                     y=[_stat(r, "tpot_ms", "median") for r in conc],
                                     mode="lines+markers", name="TPOT median ms", yaxis="y2"))
            fig.update_layout(yaxis={"title": "output tok/s"},
                              yaxis2={"title": "TPOT ms", "overlaying": "y", "side": "right"})
            fig.update_xaxes(type="log", title="concurrency")
            sec.blocks.append(figure(fig, "throughput and TPOT vs concurrency", prov))
    measured = [r for r in requests if not r.get("warmup")]
    if measured:
        fig = go.Figure()
        for metric in ("ttft_ms", "tpot_ms", "itl_ms"):
            for run in sorted({str(r.get("run")) for r in measured}):
                vals: list[float] = []
                for r in measured:
                    if str(r.get("run")) != run or not r.get("ok", True):
                        continue
                    v = r.get(metric)
                    if isinstance(v, list):
                        vals.extend(float(x) for x in v)
                    elif v is not None:
                        vals.append(float(v))
                if vals:
                    step = max(1, len(vals) // MAX_POINTS)
                    fig.add_trace(go.Box(y=vals[::step], name=plot_text(f"{metric} {run}"),
                                         boxpoints=False))
        fig.update_yaxes(type="log", title="ms")
        sec.blocks.append(figure(fig, "TTFT, TPOT and ITL distributions per run", prov, height=380))
    if not curve.empty:
        ok = curve[(curve["status"] == "ok") & curve["step_time_ms"].notna()]
        if not ok.empty:
            fig = go.Figure(go.Scatter(
                x=ok["batch_size"], y=ok["step_time_ms"], mode="lines+markers",
                name="decode step (median, p10..p90)",
                error_y={"type": "data", "array": (ok["step_time_ms_p90"] - ok["step_time_ms"]).tolist(),
                         "arrayminus": (ok["step_time_ms"] - ok["step_time_ms_p10"]).tolist()}))
            fig.update_xaxes(type="log", title="batch size")
            fig.update_yaxes(title="ms per decode step")
            sec.blocks.append(figure(fig, "fixed-batch decode step time (steady state)",
                                     view.provenance("serve", ok)))
            sec.blocks.extend(inversion_notes(ok))
            tpot = tpot_note(summary, ok)
            if tpot is not None:
                sec.blocks.append(tpot)
        else:
            sec.blocks.append(Note("decode curve: no batch size reached a steady state", "warn"))
    if attempts and not search:  # a search's attempts are in its own table above
        rows = [[a.index, a.name, a.outcome, a.summary, a.time_to_ready_s, a.time_to_failure_s,
                 "yes" if a.benchmarked else ""] for a in attempts]
        sec.blocks.append(Table("launch attempts and outcomes", ["#", "config", "outcome", "summary",
                                                                 "ready after s", "failed after s",
                                                                 "benchmarked"], rows, provenance=prov))
    if len(attempts) > 1:  # one attempt: its table row says it all
        fig = go.Figure(go.Bar(
            x=[(a.time_to_ready_s or a.time_to_failure_s or 0) for a in attempts],
            y=[plot_text(f"{a.index} {a.name}") for a in attempts], orientation="h",
            text=[plot_text(a.outcome) for a in attempts], textposition="auto",
            marker={"color": ["#2da44e" if a.ok else "#cf222e" for a in attempts]}))
        fig.update_yaxes(autorange="reversed")
        fig.update_xaxes(title="seconds until ready (ok) or until it failed")
        sec.blocks.append(figure(fig, "launch attempts: outcome and time to it", prov,
                                 height=max(220, 40 * len(attempts) + 120)))
    for a in attempts:
        if not a.ok and a.excerpt:
            sec.blocks.append(Note(f"attempt {a.index} {a.name}: {a.outcome}: {a.excerpt[:600]}",
                                   "warn"))
    return sec
