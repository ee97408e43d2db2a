"""The launch search against the field-report fault matrix, without processes: each step's real
reference-server command is parsed by the reference server's own argument parser, which picks
the fault from the matrix as the running server would (the end-to-end run is in
test_serve_bench_search_e2e.py). Also: resuming, the plan of --dry-run, the search document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcieprof.bundle.serve_search import Attempt, SearchStep, ServeSearch, Winner
from pcieprof.cards import load_card
from pcieprof.errors import BadInput
from pcieprof.refserver.args import parse_args
from pcieprof.serve.outcomes import classify
from pcieprof.serve.sglang_cmd import LaunchConfig, build_command
from pcieprof.tune.search import End, Search, Step, Tried, search_document
from pcieprof.tune.space import SearchSpace

MATRIX = Path(__file__).resolve().parents[1] / "data" / "fault_matrix" / "field_report_sm120.toml"
TINY = load_card("tiny-cpu")
NAN = "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"
CAPTURE = "[x TP0] Capturing batches (bs=16 avail_mem=0.00 GB): 33% | 2/6"
FIELD_START = {"attention_backend": "dsa", "dsa_prefill_backend": "flashmla_sparse",
               "dsa_decode_backend": "flashmla_kv"}  # what the field report's user began with


def _space(card: str = "tiny-cpu") -> SearchSpace:
    c = load_card(card)
    return SearchSpace.from_card(c.name, c.search, load_other=lambda n: load_card(n).search)


def _launch(step: Step, index: int) -> Tried:
    """What the reference server does with this step's command under the matrix."""
    cfg = LaunchConfig(extra_args=("--inject-matrix", str(MATRIX))).with_axes(step.config, "x")
    argv = build_command(TINY, cfg).argv
    assert argv[1:3] == ["-m", "pcieprof.refserver"]
    inj = parse_args(argv[3:]).inject
    progress = "[x TP0] Load weight end."
    if inj.kind == "none":
        outcome, excerpt = "ok", ""
    elif inj.kind == "hang-in-capture":
        c = classify(CAPTURE, None, hung=True)
        outcome, excerpt, progress = c.outcome.value, c.excerpt, CAPTURE
    else:
        text = {"nan-after": NAN,
                "unsupported-arch": f"RuntimeError: [pcieprof inject] {inj.line}"}[inj.kind]
        c = classify(f"Traceback (most recent call last):\n{text}\n", 1)
        outcome, excerpt = c.outcome.value, c.excerpt
    return Tried(index, step.config, outcome, excerpt, progress, step.rule, step.parent,
                 step.varied)


def _run(search: Search, limit: int = 16) -> list[Tried]:
    history: list[Tried] = []
    while len(history) < limit:
        step = search.next(history)
        if isinstance(step, End):
            break
        history.append(_launch(step, len(history)))
        if history[-1].outcome == "ok":
            break
    return history


@pytest.mark.parametrize("start", [None, FIELD_START], ids=["best-ranked", "field-start"])
def test_finds_the_one_decode_backend_that_serves_in_fewer_than_eight(start) -> None:
    h = _run(Search(_space(), start=start))
    assert h[-1].outcome == "ok", [(t.outcome, t.rule) for t in h]
    assert len(h) < 8  # the field report needed eight launches
    win = h[-1].config
    assert (win["attention_backend"], win["dsa_decode_backend"]) == ("dsa", "trtllm")
    outcomes = [t.outcome for t in h]
    assert outcomes.count("nan_in_decode") >= 2 and "hang" in outcomes
    assert [t.rule for t in h if t.outcome != "ok"][-1] != "first"
    if start:
        assert outcomes[0] == "unsupported_architecture"
        assert Search(_space(), start=start).learn(h).excluded == {
            "dsa_prefill_backend": {"flashmla_sparse"}}


def test_with_the_field_report_the_first_attempt_serves() -> None:
    h = _run(Search(_space("glm5-nvfp4")))
    assert [t.outcome for t in h] == ["ok"]
    assert h[0].config["dsa_decode_backend"] == "trtllm"


def test_resume_replays_to_the_same_next_step() -> None:
    search = Search(_space(), start=FIELD_START)
    h = _run(search)
    for k in range(len(h)):
        nxt = search.next(h[:k])
        assert isinstance(nxt, Step) and nxt.config == h[k].config and nxt.rule == h[k].rule
    # an interrupted attempt is no result: the search launches the same configuration again
    cut = [*h[:3], Tried(3, h[3].config, "interrupted", rule=h[3].rule, parent=h[3].parent,
                         varied=h[3].varied)]
    again = search.next(cut)
    assert isinstance(again, Step) and again.config == h[3].config


def test_plan_for_dry_run_and_the_end_of_a_search() -> None:
    glm = Search(_space("glm5-nvfp4"))
    plan = glm.plan(8)
    assert isinstance(plan[0], Step) and plan[0].config["dsa_decode_backend"] == "trtllm"
    assert "F1" in plan[0].sources and len(plan) == 8
    assert all(isinstance(st, Step) and st.why and st.changes for st in plan)
    # a space with one axis of two values: both fail, then it says what it exhausted
    tiny = SearchSpace.from_card("t", {"arch": "sm120", "axes": ["kv_cache_dtype"],
                                       "axis": {"kv_cache_dtype": {"values": ["bf16", "fp8_e4m3"]}}})
    s = Search(tiny)
    h = [Tried(0, s.next([]).config, "crashed")]
    h.append(Tried(1, s.next(h).config, "crashed", rule="other", parent=0))
    end = s.next(h)
    assert isinstance(end, End) and end.status == "exhausted"
    assert end.exhausted_axes == ("kv_cache_dtype",) and "kv_cache_dtype" in end.why
    capped = Search(tiny, max_attempts=1).next(h[:1])
    assert isinstance(capped, End) and capped.status == "stopped" and "--max-attempts" in capped.hint


def test_start_must_be_axes_sglang_accepts() -> None:
    with pytest.raises(BadInput, match="not an axis"):
        Search(_space(), start={"warp_size": "64"})
    with pytest.raises(BadInput, match="refuses the backends given"):
        Search(_space(), start={"dsa_decode_backend": "flashinfer_sparse_mla",
                                "kv_cache_dtype": "bf16"}).next([])


def test_search_document_reads_back() -> None:
    search = Search(_space(), start=FIELD_START)
    h = _run(search)
    rows = [Attempt(index=t.index, name=search.space.label(t.config), why="w",
                    outcome=t.outcome, excerpt=t.excerpt, last_progress=t.last_progress,
                    time_to_failure_s=None if t.outcome == "ok" else 1.5,
                    log=f"serve/server-{t.index}.log",
                    search=SearchStep(config=dict(t.config), label=search.space.label(t.config),
                                      rule=t.rule, parent=t.parent, varied=list(t.varied),
                                      why="w", changes=["c"])) for t in h]
    winner = Winner(index=h[-1].index, label=rows[-1].label, config=h[-1].config,
                    argv=["python3", "-m", "sglang.launch_server"], env={"A": "1"},
                    command="A=1 python3 -m sglang.launch_server")
    d = search_document(search, h, rows, status="found", why="attempt served", winner=winner,
                        end=None, sources={"F1": "field"}, sglang="0.5.23").to_json()
    assert d["format"] == "pcieprof.serve_search/2"
    doc = ServeSearch.from_json(json.loads(json.dumps(d)))
    assert doc.found and doc.status == "found" and doc.winner is not None
    assert doc.winner.argv[0] == "python3"
    assert doc.winner.config["dsa_decode_backend"] == "trtllm"
    assert [a.outcome for a in doc.attempts] == [t.outcome for t in h]
    assert doc.attempts[0].deciding_line.startswith("RuntimeError: [pcieprof inject]")
    assert d["excluded"] == [{"axis": "dsa_prefill_backend", "value": "flashmla_sparse",
                              "attempt": 0, "rule": "arch-named"}]
    assert {r["name"] for r in d["rules"]} >= {"nan-in-decode", "arch-named"}
    # an older or partial document still opens
    assert ServeSearch.from_json({"status": "running"}).winner is None
