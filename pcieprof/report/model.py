"""What a report is made of: sections holding figures, tables, notes and facts.

Section modules (pcieprof/report/sections/) build these from one bundle; the template renders them.
No block holds markup: every string is bundle text and is escaped by the template (jinja2
autoescape); figure specs go into one JSON block whose `<`, `>` and `&` are escaped (page.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pcieprof.analysis.provenance import measured_host, origin, part_provenance
from pcieprof.bundle import Bundle
from pcieprof.bundle.document import Readable
from pcieprof.bundle.nccl_choices import NcclChoices
from pcieprof.report.recs import RecsBlock

DocT = TypeVar("DocT", bound=Readable)


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
        full_row: takes the whole row of a wide column instead of half of it (set by the
            builder for tables too wide for half a row).
    """

    title: str
    columns: list[str]
    rows: list[list[Any]]
    provenance: str = ""
    caption: str = ""
    collapsed: bool = False
    file: Path | None = None
    total_rows: int | None = None
    full_row: bool = False
    kind: str = "table"


@dataclass
class Note:
    """A paragraph of text; `level` is info | warn | missing | headline | verdict (the VM's)."""

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
        """The host the numbers were taken on (pcieprof.analysis.provenance.measured_host)."""
        return measured_host(self.bundle.manifest)

    def origin(self) -> str:
        """Where the numbers come from, in one line (pcieprof.analysis.provenance.origin)."""
        return origin(self.bundle.manifest, self.box_hosts())

    def box_hosts(self) -> list[str]:
        """The host names an imported bundle's NCCL logs give for the box (their line prefix
        `host:pid:tid`), sorted; empty for other bundles or when no log names one."""
        if self.bundle.manifest.source != "imported":
            return []
        doc = self.doc(NcclChoices)
        hosts = {r.host for case in (doc.cases.values() if doc else ())
                 if case.parsed is not None for comm in case.parsed.comms
                 for r in comm.ranks.values() if r.host}
        return sorted(hosts)

    def table(self, name: str) -> Any:
        """`Bundle.read_table(name)`, read once."""
        if name not in self._cache:
            self._cache[name] = self.bundle.read_table(name)
        return self._cache[name]

    def doc(self, cls: type[DocT]) -> DocT | None:
        """`Bundle.read_doc(cls)` (a typed document, None when absent), read once."""
        key = f"doc:{cls.FILE}"
        if key not in self._cache:
            self._cache[key] = self.bundle.read_doc(cls)
        return self._cache[key]

    def provenance(self, part: str | None = None, rows: Any = None) -> str:
        """Provenance label for a figure (pcieprof.analysis.provenance.part_provenance)."""
        return part_provenance(self.bundle.manifest, part, rows)
