"""Every committed file of the bundle files typed late (plan.json, ...) reads through its
document and writes back every key and value it holds (an older bundle loses nothing when
rewritten; what the writer adds are keys the file lacked), and the output reads the same again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcieprof.bundle import contract
from pcieprof.bundle.document import Document
from pcieprof.bundle.nccl_graph import NcclGraph
from pcieprof.bundle.nccl_topo import NcclTopo
from pcieprof.bundle.plan import Plan
from pcieprof.importers.nccl_xml import parse_graph_xml, parse_topo_xml

TESTS = Path(__file__).resolve().parents[1]
#: The documents checked here, and each one's committed files (any bundle under tests/, the
#: runner's scratch copies included: the workers read the same shape).
KINDS: tuple[type[Document], ...] = (Plan, NcclGraph, NcclTopo)
FILES = [(cls, p) for cls in KINDS for p in sorted(TESTS.glob(f"**/{cls.FILE}"))
         if contract.entry(p.name) is not None]


def _kept(raw: object, out: object) -> bool:
    """`out` holds every key and value of `raw` (lists item by item)."""
    if isinstance(raw, dict):
        return isinstance(out, dict) and all(k in out and _kept(v, out[k]) for k, v in raw.items())
    if isinstance(raw, list):
        return isinstance(out, list) and len(raw) == len(out) and all(map(_kept, raw, out))
    return raw == out


def test_every_kind_has_a_committed_file() -> None:
    assert {cls for cls, _ in FILES} == set(KINDS) - set(IMPORTED)


#: Documents `pcieprof import` writes, whose committed sources are the XML files (no committed
#: bundle holds their JSON): each file parsed, written and read again.
IMPORTED = {NcclGraph: ("<graphs", parse_graph_xml), NcclTopo: ("<system", parse_topo_xml)}
XMLS = [(cls, p) for cls, (root, _) in IMPORTED.items() for p in sorted(TESTS.glob("**/*.xml"))
        if root in p.read_text(encoding="utf-8", errors="replace")[:4096]]


@pytest.mark.parametrize("cls,path", XMLS, ids=lambda x: str(x.relative_to(TESTS))
                         if isinstance(x, Path) else x.__name__)
def test_imported_document_round_trips(cls: type[Document], path: Path) -> None:
    doc = IMPORTED[cls][1](path.read_text(encoding="utf-8"), path.name)
    raw = json.loads(json.dumps(doc.to_json()))
    assert raw["format"] == f"{cls.FORMAT}/1"
    again = cls.from_json(raw, str(path))
    assert again == doc and again.to_json() == raw


@pytest.mark.parametrize("cls,path", FILES, ids=lambda x: str(x.relative_to(TESTS))
                         if isinstance(x, Path) else x.__name__)
def test_committed_file_reads_and_writes_back_what_it_holds(cls: type[Document],
                                                             path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    doc = cls.from_json(raw, str(path))
    out = json.loads(json.dumps(doc.to_json()))
    assert _kept(raw, out)
    assert cls.from_json(out) == doc
