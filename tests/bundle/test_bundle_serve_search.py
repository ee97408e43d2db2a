"""serve/search.json as a typed document: written through the bundle (a file of the contract),
read back whole, older files (no format tag, format 1's attempt summaries) opened, a newer format
refused; its attempts are serve/attempts.jsonl's, one shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcieprof.bundle import Bundle, contract
from pcieprof.bundle.document import encode
from pcieprof.bundle.serve_command import RecordedCommand
from pcieprof.bundle.serve_search import (Attempt, AxisValue, Exclusion, SearchAxis, SearchEnd,
                                          SearchRule, SearchStep, ServeSearch, Winner,
                                          attempts_jsonl, read_attempts)
from pcieprof.errors import BadInput


def _doc() -> ServeSearch:
    return ServeSearch(
        card="tiny-cpu", like="glm5-nvfp4", arch="sm120", sglang=None, status="found",
        why="attempt 1 served correct tokens",
        axes=[SearchAxis("dsa_decode_backend", {"attention_backend": ["dsa"]},
                         [AxisValue("trtllm", "works", "own: F1"), AxisValue("fa3", "fails")])],
        rules=[SearchRule("nan-in-decode", ["nan_in_decode"], "", "vary", ["dsa_decode_backend"],
                          "the decode kernel first")],
        excluded=[Exclusion("dsa_prefill_backend", "flashmla_sparse", 0, "arch-named")],
        attempts=[Attempt(0, "fa3", {"name": "fa3", "tp": 2},
                          RecordedCommand(argv=["python3", "-m", "sglang.launch_server"]),
                          "serve/server-0.log", outcome="nan_in_decode",
                          excerpt="  File x.py\n> RuntimeError: nan", time_to_failure_s=2.5,
                          search=SearchStep({"dsa_decode_backend": "fa3"}, "fa3", "first")),
                  Attempt(1, "trtllm", outcome="ok", time_to_ready_s=4.0,
                          search=SearchStep({"dsa_decode_backend": "trtllm"}, "trtllm",
                                            "nan-in-decode", parent=0,
                                            varied=["dsa_decode_backend"]))],
        winner=Winner(1, "trtllm", {"dsa_decode_backend": "trtllm"},
                      ["python3", "-m", "sglang.launch_server", "--dsa-decode-backend", "trtllm"],
                      {"NCCL_P2P_LEVEL": "SYS"},
                      "NCCL_P2P_LEVEL=SYS python3 -m sglang.launch_server --dsa-decode-backend "
                      "trtllm"),
        end=None, sources={"F1": "the field report"})


def test_written_and_read_back_whole(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="serve-bench", source="measured", backend="cpu")
    b.write_doc(_doc())
    assert "serve/search.json" in b.manifest.files
    entry = contract.entry("serve/search.json")
    assert entry is not None and entry.read_as is ServeSearch
    raw = json.loads((b.path / "serve" / "search.json").read_text())
    assert raw["format"] == "pcieprof.serve_search/2"
    doc = Bundle.open(b.path).read_doc(ServeSearch)
    assert doc is not None and doc.to_json() == _doc().to_json()
    assert doc.found and doc.winner is not None and doc.winner.argv[0] == "python3"
    assert [a.outcome for a in doc.results] == ["nan_in_decode", "ok"]
    assert doc.attempts[0].time_to_failure_s == 2.5 and doc.attempts[1].search is not None
    assert doc.attempts[1].search.parent == 0 and doc.attempts[0].deciding_line == "RuntimeError: nan"
    assert (doc.attempts[0].label, doc.attempts[0].rule) == ("fa3", "first")


def test_the_attempts_are_those_of_attempts_jsonl() -> None:
    # one shape: an attempt of serve/search.json is the attempts.jsonl row of the same attempt
    doc = _doc()
    raw = json.loads(json.dumps(doc.to_json()))
    text = attempts_jsonl(doc.attempts)
    assert [json.loads(ln) for ln in text.splitlines()] == raw["attempts"]
    assert read_attempts(text) == doc.attempts
    # rows of an attempt no search chose said `search: {}` before SearchStep: read as None;
    # a last row cut short by a kill is left out
    old = {**encode(Attempt(0, "given", outcome="ok")), "search": {}}
    assert read_attempts(json.dumps(old) + "\n" + '{"index": 1, "na') == [
        Attempt(0, "given", outcome="ok")]
    with pytest.raises(BadInput, match="attempt row 1"):
        read_attempts('{"index": 1, "na\n' + json.dumps(old))


def test_a_format_1_file_reads_its_attempts_as_attempts() -> None:
    # format 1 stored a summary of each attempt: the search's fields at its top level and the
    # deciding line alone
    v1 = {"format": "pcieprof.serve_search/1", "status": "found", "attempts": [
        {"index": 0, "label": "fa3", "config": {"dsa_decode_backend": "fa3"}, "rule": "first",
         "parent": None, "varied": [], "why": "first ranked", "changes": ["c"],
         "outcome": "nan_in_decode", "summary": "NaN in decode",
         "deciding_line": "RuntimeError: nan", "time_to_failure_s": 2.5,
         "time_to_ready_s": None, "log": "serve/server-0.log"},
        {"index": 1, "label": "trtllm", "config": {"dsa_decode_backend": "trtllm"},
         "rule": "nan-in-decode", "parent": 0, "varied": ["dsa_decode_backend"], "why": "w",
         "changes": [], "outcome": "ok", "summary": "served correct tokens",
         "deciding_line": "", "time_to_failure_s": None, "time_to_ready_s": 4.0,
         "log": "serve/server-1.log"}]}
    doc = ServeSearch.from_json(v1)
    a, b = doc.attempts
    assert (a.index, a.label, a.rule, a.outcome, a.deciding_line, a.time_to_failure_s, a.log) == (
        0, "fa3", "first", "nan_in_decode", "RuntimeError: nan", 2.5, "serve/server-0.log")
    assert a.search == SearchStep({"dsa_decode_backend": "fa3"}, "fa3", "first", None, [],
                                  "first ranked", ["c"])
    assert b.ok and b.deciding_line == "" and b.search is not None and b.search.parent == 0
    assert doc.to_json()["format"] == "pcieprof.serve_search/2"


def test_an_older_file_opens_and_a_newer_one_is_refused() -> None:
    # the serve branch's files had no format tag, a schema_version key instead
    old = ServeSearch.from_json({"schema_version": 1, "status": "interrupted",
                                 "attempts": [{"index": 0, "outcome": "interrupted"}],
                                 "winner": None})
    assert old.status == "interrupted" and not old.found and old.results == []
    assert old.extra == {"schema_version": 1}
    with pytest.raises(BadInput, match="newer"):
        ServeSearch.from_json({"format": "pcieprof.serve_search/3", "status": "found"})
    end = ServeSearch.from_json({"status": "exhausted", "end": {"status": "exhausted",
                                                                "why": "w", "hint": "h"}})
    assert end.end == SearchEnd("exhausted", "w", "h")
