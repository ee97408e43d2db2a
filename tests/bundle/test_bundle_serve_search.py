"""serve/search.json as a typed document: written through the bundle (a file of the contract),
read back whole, older files (no format tag) opened with defaults, a newer format refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcieprof.bundle import Bundle, contract
from pcieprof.bundle.serve_search import (AxisValue, Exclusion, SearchAttempt, SearchAxis,
                                          SearchEnd, SearchRule, ServeSearch, Winner)
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
        attempts=[SearchAttempt(0, "fa3", {"dsa_decode_backend": "fa3"}, "first",
                                outcome="nan_in_decode", deciding_line="RuntimeError: nan",
                                time_to_failure_s=2.5, log="serve/server-0.log"),
                  SearchAttempt(1, "trtllm", {"dsa_decode_backend": "trtllm"}, "nan-in-decode",
                                parent=0, varied=["dsa_decode_backend"], outcome="ok",
                                time_to_ready_s=4.0)],
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
    assert raw["format"] == "pcieprof.serve_search/1"
    doc = Bundle.open(b.path).read_doc(ServeSearch)
    assert doc is not None and doc.to_json() == _doc().to_json()
    assert doc.found and doc.winner is not None and doc.winner.argv[0] == "python3"
    assert [a.outcome for a in doc.results] == ["nan_in_decode", "ok"]
    assert doc.attempts[0].time_to_failure_s == 2.5 and doc.attempts[1].parent == 0


def test_an_older_file_opens_and_a_newer_one_is_refused() -> None:
    # the serve branch's files had no format tag, a schema_version key instead
    old = ServeSearch.from_json({"schema_version": 1, "status": "interrupted",
                                 "attempts": [{"index": 0, "outcome": "interrupted"}],
                                 "winner": None})
    assert old.status == "interrupted" and not old.found and old.results == []
    assert old.extra == {"schema_version": 1}
    with pytest.raises(BadInput, match="newer"):
        ServeSearch.from_json({"format": "pcieprof.serve_search/2", "status": "found"})
    end = ServeSearch.from_json({"status": "exhausted", "end": {"status": "exhausted",
                                                                "why": "w", "hint": "h"}})
    assert end.end == SearchEnd("exhausted", "w", "h")
