"""Assemble the report: bundles -> sections -> one self-contained HTML file.

plotly.js is inlined once in a <script> in the page head; every figure is a bare <div> with its
own small newPlot call, so the file opens from disk with no network.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import jinja2

from pcieprof import __version__
from pcieprof.bundle import Bundle, atomic_write_text, now_iso
from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Note, Section

#: Section modules in page order. Each has build(view, ctx) -> Section | None.
SECTION_MODULES: tuple[str, ...] = (
    "summary", "machine", "p2p", "concurrent", "allreduce", "serve", "attribution",
    "recommendations", "tables",
)
#: Sections shown even when empty, with a "not measured" line (the core of issue 2's report).
ALWAYS_SHOWN = {"machine": "The machine", "p2p": "P2P copies between GPUs",
                "allreduce": "All-reduce"}


@dataclass
class SectionRow:
    """One section across bundles: a column per bundle (None where the bundle lacks it)."""

    id: str
    title: str
    columns: list[tuple[BundleView, Section | None]]


def open_views(bundles: Sequence[Path | str | Bundle]) -> list[BundleView]:
    """Open bundles and give each a short unique label (host and directory name)."""
    views: list[BundleView] = []
    seen: dict[str, int] = {}
    for b in bundles:
        bundle = b if isinstance(b, Bundle) else Bundle.open(Path(b))
        label = f"{bundle.manifest.get('host', '?')}: {bundle.path.name}"
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label += f" ({seen[label]})"
        views.append(BundleView(bundle=bundle, label=label))
    return views


def _section_builder(name: str) -> Callable[[BundleView, ReportContext], Section | None] | None:
    try:
        module = importlib.import_module(f"pcieprof.report.sections.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"pcieprof.report.sections.{name}":
            return None
        raise
    return getattr(module, "build")


def build_sections(views: list[BundleView], ctx: ReportContext) -> list[SectionRow]:
    """Every section for every bundle, in page order; empty rows dropped unless ALWAYS_SHOWN."""
    ctx.views = list(views)
    rows: list[SectionRow] = []
    for name in SECTION_MODULES:
        build = _section_builder(name)
        if build is None:
            continue
        cols = [(v, build(v, ctx)) for v in views]
        present = [s for _, s in cols if s is not None]
        if not present and name not in ALWAYS_SHOWN:
            continue
        title = present[0].title if present else ALWAYS_SHOWN[name]
        cols = [(v, s if s is not None else Section(name, title, [Note("not measured", "missing")]))
                for v, s in cols]
        rows.append(SectionRow(name, title, cols))
    if len(views) > 1:
        build = _section_builder("compare")
        if build is not None:
            shared = build(views, ctx)  # type: ignore[arg-type]
            if shared is not None:
                rows.insert(1 if rows and rows[0].id == "summary" else 0,
                            SectionRow(shared.id, shared.title, [(views[0], shared)]))
    return rows


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pcieprof.report", "templates"),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def plotly_js() -> str:
    """plotly.js from the installed plotly package (inlined into the page once)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def render_html(views: list[BundleView], ctx: ReportContext | None = None) -> str:
    """The report as one HTML string."""
    ctx = ctx or ReportContext()
    rows = build_sections(views, ctx)
    nfig = sum(len(s.figures()) for r in rows for _, s in r.columns if s is not None)
    env = _env()
    template = env.get_template("report.html.j2")
    css = (Path(__file__).parent / "templates" / "report.css").read_text(encoding="utf-8")
    return template.render(
        views=views, rows=rows, ctx=ctx, generated=now_iso(), version=__version__,
        nfigures=nfig, css=css, plotly_js=plotly_js(), single=len(views) == 1,
        markup=jinja2.utils.markupsafe.Markup, manifest_facts=manifest_facts)


def write_report(bundles: Sequence[Path | str | Bundle], out: Path | str,
                 *, ctx: ReportContext | None = None) -> Path:
    """Write one self-contained offline HTML report for one or more bundles.

    Args:
        bundles: bundle directories (or open Bundles); several are shown side by side.
        out: the HTML file to write.
        ctx: report settings (decode band, model); defaults to GLM-5 at batch 1..64.

    Returns:
        The path written.
    """
    views = open_views(bundles)
    if not views:
        from pcieprof.errors import BadInput

        raise BadInput("no bundle given to report on")
    out = Path(out)
    atomic_write_text(out, render_html(views, ctx))
    return out


def manifest_facts(view: BundleView) -> list[tuple[str, Any]]:
    """The provenance lines of a bundle for the first screen."""
    m = view.bundle.manifest
    parts = m.get("parts", {})
    part_txt = ", ".join(f"{k}: {v.get('status')} ({v.get('source')}, {v.get('backend')})"
                         for k, v in parts.items()) or "none"
    return [("source", m.get("source")), ("backend", m.get("backend")),
            ("status", f"{m.get('status')}" + (f" ({m['why']})" if m.get("why") else "")),
            ("command", " ".join(str(a) for a in m.get("argv") or []) or m.get("command")),
            ("time", f"{m.get('start_time')} .. {m.get('end_time')}"),
            ("versions", ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items() if v)
             or "not recorded"),
            ("parts", part_txt)]
