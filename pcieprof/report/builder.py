"""Assemble the report: bundles -> sections -> one self-contained HTML file.

plotly.js is embedded once (packed, see page.py) and every figure is a spec in one JSON block
that the page's loader draws, so the file opens from disk with no network. The page reads in
one screen per question: a section draws a column only for the bundles that have something
for it, table columns empty in every row are dropped, long tables are folded, and each bundle
is named by its own directory name with its provenance (never this machine's host name).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import jinja2

from pcieprof import __version__
from pcieprof.bundle import Bundle, atomic_write_text, now_iso
from pcieprof.errors import BadInput
from pcieprof.redact import redact
from pcieprof.report import page
from pcieprof.report.context import ReportContext
from pcieprof.report.model import BundleView, Figure, Note, NoteGroup, Section, Table
from pcieprof.report.sections import (allreduce, attribution, compare, concurrent, machine, p2p,
                                      recommendations, serve, summary, tables, vm)

#: The sections in page order: (id, build(view, ctx) -> Section | None). A new section is a
#: module of pcieprof.report.sections and a line here.
SECTIONS: tuple[tuple[str, Callable[[BundleView, ReportContext], Section | None]], ...] = (
    ("summary", summary.build), ("vm", vm.build), ("machine", machine.build), ("p2p", p2p.build),
    ("concurrent", concurrent.build), ("allreduce", allreduce.build), ("serve", serve.build),
    ("attribution", attribution.build), ("recommendations", recommendations.build),
    ("tables", tables.build),
)
#: Sections shown even when empty, with a "not measured" line (the core of issue 2's report).
ALWAYS_SHOWN = {"machine": "The machine", "p2p": "P2P copies between GPUs",
                "allreduce": "All-reduce"}
#: Tables longer than this are drawn folded (their title stays visible).
FOLD_ROWS = 12
#: This many notes of one level in a row (info or missing, never a warning) show only the first.
FOLD_NOTES = 3
#: Short names of the sections in the page's navigation bar, so it keeps to one line down to a
#: 1024 px window (the full title is the link's tooltip and the section's heading).
NAV_TITLES = {"compare": "Side by side", "vm": "VM cost", "machine": "Machine", "p2p": "P2P",
              "concurrent": "Concurrent", "serve": "Serving", "attribution": "Attribution"}
#: A text cell longer than this (characters) may wrap in its table (class "text"); shorter
#: cells and numbers never break.
TEXT_CELL = 24
#: A table whose natural width is above this (in characters, see `natural_chars`) takes the
#: whole row of a wide column: half a row at 1400 px (~660 px) holds about 90 characters of
#: 12 px text.
HALF_ROW_CHARS = 90
#: A recommendation's action longer than this (characters, e.g. a whole SGLang command) is
#: folded under its first words; a risk longer than this shows its first words, all of it folded.
LONG_ACTION = 240
LONG_RISK = 160


@dataclass
class SectionRow:
    """One section across bundles: a column per bundle that has something for it.

    Attributes:
        missing: the bundles that have nothing for the section (named in one line, no column).
    """

    id: str
    title: str
    columns: list[tuple[BundleView, Section]]
    missing: list[BundleView] = field(default_factory=list)


def open_views(bundles: Sequence[Path | str | Bundle]) -> list[BundleView]:
    """Open bundles and label each by its own directory name (with its parent's when two match)."""
    opened = [b if isinstance(b, Bundle) else Bundle.open(Path(b)) for b in bundles]
    names = [b.path.name for b in opened]
    views: list[BundleView] = []
    seen: dict[str, int] = {}
    for bundle, name in zip(opened, names):
        label = name
        if names.count(name) > 1 and bundle.path.parent.name:
            label = f"{bundle.path.parent.name}/{name}"
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label += f" ({seen[label]})"
        views.append(BundleView(bundle=bundle, label=label))
    return views


def build_sections(views: list[BundleView], ctx: ReportContext) -> list[SectionRow]:
    """Every section in page order, with a column only for the bundles that have it.

    A section no bundle has is left out, unless ALWAYS_SHOWN: then it says "not measured".
    """
    ctx.views = list(views)
    rows: list[SectionRow] = []
    for name, build in SECTIONS:
        built = [(v, build(v, ctx)) for v in views]
        cols = [(v, s) for v, s in built if s is not None]
        missing = [v for v, s in built if s is None]
        if not cols:
            if name not in ALWAYS_SHOWN:
                continue
            what = "this bundle" if len(views) == 1 else "any of the bundles"
            cols = [(views[0], Section(name, ALWAYS_SHOWN[name],
                                       [Note(f"not measured in {what}", "missing")]))]
            missing = []
        rows.append(SectionRow(name, cols[0][1].title, cols, missing))
    if len(views) > 1:
        shared = compare.build(views, ctx)  # one section across the bundles
        if shared is not None:
            rows.insert(1 if rows and rows[0].id == "summary" else 0,
                        SectionRow(shared.id, shared.title, [(views[0], shared)]))
    _finish_blocks(rows)
    return rows


def _finish_blocks(rows: list[SectionRow]) -> None:
    """Presentation rules for every block: figure ids, empty table columns, folding."""
    n = 0
    for row in rows:
        for _, sec in row.columns:
            sec.blocks = fold_notes(sec.blocks)
            for b in sec.blocks:
                if isinstance(b, Figure):
                    b.id = f"fig-{n}"
                    n += 1
                elif isinstance(b, Table):
                    drop_empty_columns(b)
                    b.collapsed = b.collapsed or len(b.rows) > FOLD_ROWS
                    b.full_row = natural_chars(b) > HALF_ROW_CHARS


def natural_chars(table: Table) -> int:
    """About how many characters wide `table` is drawn: per column its widest cell (a text cell
    counted at TEXT_CELL, as it wraps; a header at its longest word, as headers wrap), plus two
    for the cell's padding and border."""
    total = 0
    for i, name in enumerate(table.columns):
        cells = [r[i] for r in table.rows if i < len(r) and r[i] is not None]
        widest = max([min(len(str(c)), TEXT_CELL) for c in cells]
                     + [len(w) for w in str(name).split()] + [1])
        total += widest + 2
    return total


def nav_title(row: SectionRow) -> str:
    """A section's name in the navigation bar (NAV_TITLES, else its title)."""
    return NAV_TITLES.get(row.id, row.title)


def fold_notes(blocks: list[Any]) -> list[Any]:
    """Runs of FOLD_NOTES or more info (or missing) notes become one NoteGroup."""
    out: list[Any] = []
    run: list[Note] = []

    def flush() -> None:
        if len(run) >= FOLD_NOTES:
            out.append(NoteGroup(list(run)))
        else:
            out.extend(run)
        run.clear()

    for b in blocks:
        if isinstance(b, Note) and b.level in ("info", "missing") and (
                not run or run[0].level == b.level):
            run.append(b)
            continue
        flush()
        if isinstance(b, Note) and b.level in ("info", "missing"):
            run.append(b)
        else:
            out.append(b)
    flush()
    return out


def _empty(cell: Any) -> bool:
    return cell is None or cell == "" or (isinstance(cell, float) and math.isnan(cell))


def drop_empty_columns(table: Table) -> None:
    """Drop the columns of `table` that are empty (None, "", NaN) in every row."""
    if not table.rows:
        return
    keep = [i for i in range(len(table.columns))
            if not all(_empty(r[i]) for r in table.rows if i < len(r))]
    if len(keep) == len(table.columns):
        return
    table.columns = [table.columns[i] for i in keep]
    table.rows = [[r[i] for i in keep if i < len(r)] for r in table.rows]


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pcieprof.report", "templates"),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def render_html(views: list[BundleView], ctx: ReportContext | None = None, *,
                out_dir: Path | None = None) -> str:
    """The report as one HTML string.

    Args:
        views: the bundles, in column order.
        ctx: report settings.
        out_dir: where the page will be written; links to bundle files are relative to it
            (absolute file URLs when None or on another drive).
    """
    ctx = ctx or ReportContext()
    rows = build_sections(views, ctx)
    figures = [b for r in rows for _, s in r.columns for b in s.blocks if isinstance(b, Figure)]
    env = _env()
    template = env.get_template("report.html.j2")
    here = Path(__file__).parent / "templates"
    return template.render(
        views=views, rows=rows, ctx=ctx, generated=now_iso(), version=__version__,
        nfigures=len(figures), css=(here / "report.css").read_text(encoding="utf-8"),
        loader_js=(here / "report.js").read_text(encoding="utf-8"),
        plotly=page.packed_plotly(), unsafe=list(page.UNSAFE7),
        figures_json=page.figures_json(figures), multi=len(views) > 1, always_shown=ALWAYS_SHOWN,
        markup=jinja2.utils.markupsafe.Markup, manifest_facts=manifest_facts,
        nav_title=nav_title, TEXT_CELL=TEXT_CELL, LONG_ACTION=LONG_ACTION,
        LONG_RISK=LONG_RISK,
        href=lambda p: file_href(Path(p), out_dir))


def file_href(path: Path, out_dir: Path | None) -> str:
    """A link to a bundle file: relative to the page's directory when it can be, else file://."""
    path = path.resolve()
    if out_dir is not None:
        try:
            return Path(os.path.relpath(path, out_dir.resolve())).as_posix()
        except ValueError:  # another drive (Windows): no relative path
            pass
    return path.as_uri()


def write_report(bundles: Sequence[Path | str | Bundle], out: Path | str,
                 *, ctx: ReportContext | None = None) -> Path:
    """Write one self-contained offline HTML report for one or more bundles.

    Args:
        bundles: bundle directories (or open Bundles); several are shown side by side.
        out: the HTML file to write.
        ctx: report settings (decode band, model); defaults to the default card (pcieprof.cards.DEFAULT_CARD) at batch 1..64.

    Returns:
        The path written.
    """
    views = open_views(bundles)
    if not views:
        raise BadInput("no bundle given to report on")
    out = Path(out)
    atomic_write_text(out, render_html(views, ctx, out_dir=out.parent))
    return out


def manifest_facts(view: BundleView) -> list[tuple[str, Any]]:
    """The provenance lines of a bundle (the page's last section)."""
    m = view.bundle.manifest
    part_txt = ", ".join(f"{k}: {v.status} ({v.source}, {v.backend})"
                         for k, v in m.parts.items()) or "none"
    return [("numbers", view.origin()), ("source", m.source), ("backend", m.backend),
            ("status", str(m.status) + (f" ({m.why})" if m.why else "")),
            # masked again: a bundle written before pcieprof masked secrets may hold them
            ("command", " ".join(redact([str(a) for a in m.argv])) or m.command),
            ("time", f"{m.start_time} .. {m.end_time}"),
            ("versions", ", ".join(f"{k} {v}" for k, v in m.versions.items() if v)
             or "not recorded"),
            ("parts", part_txt)] + ([("nodes", f"{nodes.describe(view.bundle.backend)}, node "
                                      f"{nodes.node_rank}; collective rows: {nodes.collective_rows}")]
                                    if (nodes := view.bundle.nodes()) is not None else [])
