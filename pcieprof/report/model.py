"""What a report is made of: sections holding figures, tables, notes and facts.

Section modules (pcieprof/report/sections/) build these from one bundle; the template renders them.
No block holds markup: every string is bundle text and is escaped by the template (jinja2
autoescape); figure specs go into one JSON block whose `<`, `>` and `&` are escaped (page.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcieprof.bundle import Bundle
from pcieprof.report.recs import RecsBlock


@dataclass
class Figure:
    """A plotly figure: its compact spec, drawn by the page's loader (plotly.js once per page).

    Attributes:
        title: plain text, shown above the plot (it wraps; an SVG title would be cut off).
        spec: {"data": [...], "layout": {...}} as plain JSON values (see figures.figure).
        provenance: where the numbers came from, shown with the title.
        height: plot height in pixels.
        shape: "wide" (curves, bars) or "square" (heatmaps: two fit side by side).
        id: the id of its plot <div>, set by the builder.
    """

    title: str
    spec: dict[str, Any]
    provenance: str
    height: int = 340
    shape: str = "wide"
    id: str = ""
    kind: str = "figure"


@dataclass
class Table:
    """A table of plain values; cells are escaped when rendered.

    Attributes:
        collapsed: drawn folded (<details>); the builder also folds every long table.
        file: the file the rows come from (e.g. the bundle's allreduce.csv), linked under it.
        total_rows: rows in `file` when `rows` is only the first of them.
    """

    title: str
    columns: list[str]
    rows: list[list[Any]]
    provenance: str = ""
    caption: str = ""
    collapsed: bool = False
    file: Path | None = None
    total_rows: int | None = None
    kind: str = "table"


@dataclass
class Note:
    """A paragraph of text; `level` is info | warn | missing."""

    text: str
    level: str = "info"
    kind: str = "note"


@dataclass
class NoteGroup:
    """A run of notes of one level: the first shown, the rest folded (made by the builder)."""

    notes: list[Note]
    kind: str = "notes"


@dataclass
class Facts:
    """A list of (name, value) pairs shown as a definition list."""

    title: str
    items: list[tuple[str, Any]]
    provenance: str = ""
    kind: str = "facts"


@dataclass
class Tree:
    """An indented tree (the PCIe hierarchy): each line is (depth, label, detail, css class)."""

    title: str
    lines: list[tuple[int, str, str, str]]
    provenance: str = ""
    collapsed: bool = False
    kind: str = "tree"


Block = Figure | Table | Note | NoteGroup | Facts | Tree | RecsBlock


@dataclass
class Section:
    """One section of the report for one bundle (or for all bundles, when `shared`)."""

    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)

    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]


@dataclass
class BundleView:
    """A bundle as the report sees it: its label, provenance and the tables once read."""

    bundle: Bundle
    label: str
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.bundle.path

    @property
    def measured_host(self) -> str | None:
        """The host the bundle's numbers were taken on, from the manifest; None when simulated.

        A simulated bundle ran on some machine but measured none, so it names no host (older
        bundles recorded one anyway; it is not shown).
        """
        if self.bundle.source == "simulated":
            return None
        host = self.bundle.manifest.get("host")
        return str(host) if host and host != "unknown" else None

    def origin(self) -> str:
        """One line saying where the bundle's numbers come from, e.g. `simulated: fabric model
        rtxpro6000-8x-vm (not hardware)` or `measured on host gpu-01, backend cuda`."""
        m = self.bundle.manifest
        backend = str(m.get("backend") or "unknown")
        if self.bundle.source == "simulated":
            profile = ((m.get("versions") or {}).get("sim_profile")
                       or (m.get("parts", {}).get("discovery") or {}).get("profile"))
            return f"simulated: fabric model {profile or '(profile not recorded)'} (not hardware)"
        host = self.measured_host
        where = f" on host {host}" if host else " (host not recorded)"
        note = {"cpu": " (CPUs and host memory, not GPUs)"}.get(backend, "")
        return f"{self.bundle.source}{where}, backend {backend}{note}"

    def table(self, name: str) -> Any:
        """`Bundle.read_table(name)`, read once."""
        if name not in self._cache:
            self._cache[name] = self.bundle.read_table(name)
        return self._cache[name]

    def json(self, name: str, default: Any = None) -> Any:
        """`Bundle.read_json(name)`, read once."""
        key = f"json:{name}"
        if key not in self._cache:
            self._cache[key] = self.bundle.read_json(name, default)
        return self._cache[key]

    def provenance(self, part: str | None = None, rows: Any = None) -> str:
        """Provenance label for a figure: source and backend of a part, or of the rows drawn.

        Args:
            part: the manifest part the numbers come from (e.g. "p2p").
            rows: a DataFrame whose `backend` column says which backend produced each row.
        """
        m = self.bundle.manifest
        p = m.get("parts", {}).get(part, {}) if part else {}
        source = p.get("source") or m.get("source") or "unknown"
        backends: list[str] = []
        if rows is not None and "backend" in getattr(rows, "columns", []):
            backends = sorted({str(b) for b in rows["backend"].dropna() if str(b)})
        if not backends:
            backends = [str(p.get("backend") or m.get("backend") or "unknown")]
        return provenance_text(source, backends)


def provenance_text(source: str, backends: list[str]) -> str:
    """`measured, backend cpu (this machine's CPUs, not GPUs)` and the like."""
    from pcieprof.schema import source_of

    notes = {"cpu": " (this machine's CPUs and host memory, not GPUs)", "sim": " (fabric model)"}
    parts = []
    for b in backends:
        try:
            src = source_of(b)
        except KeyError:
            src = source
        parts.append(f"{src}, backend {b}{notes.get(b, '')}")
    if not parts:
        parts = [source]
    return "; ".join(parts)
