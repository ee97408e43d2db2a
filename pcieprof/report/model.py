"""What a report is made of: sections holding figures, tables, notes and facts.

Section modules (pcieprof/report/sections/) build these from one bundle; the template renders them.
Only `Figure.html` is trusted markup (plotly's own output, whose JSON escapes `<`); every other
string is bundle text and is escaped by the template (jinja2 autoescape).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pcieprof.analysis.provenance import part_provenance
from pcieprof.bundle import Bundle
from pcieprof.bundle.document import Readable

DocT = TypeVar("DocT", bound=Readable)


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


Block = Figure | Table | Note | Facts | Tree


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

    def doc(self, cls: type[DocT]) -> DocT | None:
        """`Bundle.read_doc(cls)` (a typed document, None when absent), read once."""
        key = f"doc:{cls.FILE}"
        if key not in self._cache:
            self._cache[key] = self.bundle.read_doc(cls)
        return self._cache[key]

    def provenance(self, part: str | None = None, rows: Any = None) -> str:
        """Provenance label for a figure (pcieprof.analysis.provenance.part_provenance)."""
        return part_provenance(self.bundle.manifest, part, rows)
