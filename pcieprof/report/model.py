"""What a report is made of: sections holding figures, tables, notes and facts.

Section modules (pcieprof/report/sections/) build these from one bundle; the template renders them.
Only `Figure.html` is trusted markup (plotly's own output, whose JSON escapes `<`); every other
string is bundle text and is escaped by the template (jinja2 autoescape).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcieprof.bundle import Bundle
from pcieprof.report.recs import RecsBlock


@dataclass
class Figure:
    """A plotly figure rendered to a <div> (plotly.js is inlined once for the whole page)."""

    title: str
    html: str
    provenance: str
    kind: str = "figure"


@dataclass
class Table:
    """A table of plain values; cells are escaped when rendered."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    provenance: str = ""
    caption: str = ""
    kind: str = "table"


@dataclass
class Note:
    """A paragraph of text; `level` is info | warn | missing."""

    text: str
    level: str = "info"
    kind: str = "note"


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
    kind: str = "tree"


Block = Figure | Table | Note | Facts | Tree | RecsBlock


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
