"""Every committed file of the bundle files typed late (plan.json, ...) reads through its
document and writes back every key and value it holds (an older bundle loses nothing when
rewritten; what the writer adds are keys the file lacked), and the output reads the same again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcieprof.bundle import contract
from pcieprof.bundle.attribution import Attribution
from pcieprof.bundle.document import Document
from pcieprof.bundle.nccl_graph import NcclGraph
from pcieprof.bundle.nccl_topo import NcclTopo
from pcieprof.bundle.model import ModelCardFile
from pcieprof.bundle.nccl_choices import NcclChoices, NcclParsed
from pcieprof.bundle.plan import Plan
from pcieprof.bundle.server_info import ServerInfo
from pcieprof.cards import CARDS_DIR
from pcieprof.cards.toml_file import read_card_file
from pcieprof.importers.nccl_log import parse_nccl_log
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


@pytest.mark.parametrize("path", sorted(TESTS.glob("**/attribution.json")),
                         ids=lambda p: str(p.relative_to(TESTS)))
def test_attribution_version_1_reads_and_writes_back_what_it_holds(path: Path) -> None:
    # version 2 only completes cross_rank: a version 1 file keeps every key and value, and its
    # classification table keeps its columns in their order (classes.csv, the report's table)
    raw = json.loads(path.read_text(encoding="utf-8"))
    doc = Attribution.from_json(raw, str(path))
    out = json.loads(json.dumps(doc.to_json()))
    assert (raw["attribution_version"], out["attribution_version"]) == (1, 2)
    assert _kept({k: v for k, v in raw.items() if k != "attribution_version"}, out)
    assert list(out["classes"][0]) == ["pattern", "family", "applies_to", "source", "origin",
                                       "class"]
    assert set(out["cross_rank"]) == {"status", "why", "n_collectives", "transfer_us",
                                      "per_rank", "unmatched"}
    assert [r.skew for r in doc.ranks] == doc.cross_rank.per_rank
    assert Attribution.from_json(out) == doc


@pytest.mark.parametrize("path", sorted(TESTS.glob("**/nccl_choices.json")),
                         ids=lambda p: str(p.relative_to(TESTS)))
def test_nccl_choices_version_1_reads_and_writes_back_what_it_holds(path: Path) -> None:
    # version 2 only gives every communicator its `failures`: a version 1 parse keeps every key
    # and value, its communicators typed
    raw = json.loads(path.read_text(encoding="utf-8"))
    doc = NcclChoices.from_json(raw, str(path))
    out = json.loads(json.dumps(doc.to_json()))
    for case in raw.values():
        if case.get("parsed"):
            assert case["parsed"].pop("format") == "pcieprof.nccl_choices/1"
    assert _kept(raw, out)
    assert NcclChoices.from_json(out) == doc


@pytest.mark.parametrize("log", ["nccl_log_2.7_ray_pid_tag_peer_access_unsupported_raylightning24.log",
                                 "nccl_log_comm_split_color_runtime_connect_deepspeed_4node_g6e.log"])
def test_nccl_log_parse_of_version_1_reads_as_version_2(log: str) -> None:
    # a version 1 parse (communicators without `failures` where none hit them) reads as the
    # same parse; written again, it is version 1's bytes plus those keys
    doc = parse_nccl_log((TESTS / "data" / "importers" / log).read_text(encoding="utf-8"), log)
    v2 = json.loads(json.dumps(doc.to_json()))
    v1 = json.loads(json.dumps(v2))
    v1["format"] = "pcieprof.nccl_choices/1"
    for comm in v1["comms"]:
        if not comm["failures"]:
            del comm["failures"]
    assert NcclParsed.from_json(v1) == doc
    assert v2["format"] == "pcieprof.nccl_choices/2" and doc.comms
    assert all(list(c)[-1] == "failures" for c in v2["comms"])


def test_server_info_keeps_the_servers_keys_as_answered() -> None:
    # the keys are the server's (none is pcieprof's): read and written back unchanged, nested
    # values and nulls included
    answer = {"tp_size": 2, "model_path": "m", "internal_states": [{"avg_spec_accept_length": None}],
              "version": "0.5.4"}
    doc = ServerInfo.from_json(answer)
    assert doc.extra == answer and doc.to_json() == answer


@pytest.mark.parametrize("toml", sorted(CARDS_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_model_card_file_keeps_a_shipped_card(toml: Path, tmp_path: Path) -> None:
    # model_card.json is the card file's tables as JSON, through the card's own decoder: a card
    # read back from it is the same card (its content hash), its tables written back unchanged
    card = read_card_file(toml)
    raw = json.loads(json.dumps(ModelCardFile.of(card).to_json()))
    doc = ModelCardFile.from_json(raw)
    assert doc.to_json() == raw
    assert doc.card(tmp_path / "model_card.json").content_hash == card.content_hash
