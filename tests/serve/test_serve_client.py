"""The load client and its metrics against a local fake-token server with known timing."""

from __future__ import annotations

import asyncio

import pytest

from pcieprof.errors import BadInput
from pcieprof.serve.client import LoadSpec, make_prompts, run_load
from builders.fakeserver import FakeServer
from pcieprof.serve.metrics import RequestRecord, format_table, stats, summarize


def test_prompts_are_reproducible_and_exact_length() -> None:
    a = make_prompts(3, 17, seed=5, low=10, high=20)
    assert a == make_prompts(3, 17, seed=5, low=10, high=20)
    assert a != make_prompts(3, 17, seed=6, low=10, high=20)
    assert all(len(p) == 17 and all(10 <= t < 20 for t in p) for p in a)


@pytest.mark.parametrize("api", ["generate", "completions"])
def test_timings_match_the_servers_pacing(api: str) -> None:
    # 200 ms before the first token, then one token every 100 ms: paced slowly enough that what
    # a loaded machine adds to each wake-up (tens of ms at worst) stays inside the bounds below
    # (at 10 ms a token, wake-ups 15 ms late would break the old 25 ms bound)
    with FakeServer(token_delay_s=0.100, ttft_s=0.200) as srv:
        spec = LoadSpec(api=api, input_len=8, output_len=12, num_requests=6, concurrency=3,
                        warmup=1)
        recs, dur = asyncio.run(run_load(srv.url, spec))
    assert len(recs) == 7 and recs[0].warmup and not any(r.warmup for r in recs[1:])
    assert all(r.ok and r.output_len == 12 for r in recs), [r.error for r in recs]
    s = summarize(recs, label=spec.label, concurrency=3, request_rate=None, duration_s=dur)
    assert s.completed == 6 and s.output_len_mismatch == 0
    assert s.total_output_tokens == 72
    assert 190 <= s.ttft_ms["median"] < 400
    # TPOT = (E2E - TTFT) / 11 with 11 gaps of ~100 ms (plus the last delay before [DONE]).
    assert 95 <= s.tpot_ms["median"] < 200
    assert s.itl_ms["n"] == 6 * 11
    assert 95 <= s.itl_ms["median"] < 200
    assert s.request_throughput == pytest.approx(6 / dur)
    assert "c=3" in format_table([s])


def test_errors_are_recorded_not_raised() -> None:
    with FakeServer() as srv:
        spec = LoadSpec(output_len=200_000, num_requests=2, concurrency=2, warmup=0)
        recs, dur = asyncio.run(run_load(srv.url, spec))
    assert all(not r.ok and r.error.startswith("HTTP 400") for r in recs)
    s = summarize(recs, label="c=2", concurrency=2, request_rate=None, duration_s=dur)
    assert s.failed == 2 and s.ttft_ms["n"] == 0 and s.errors


def test_request_rate_run_and_bad_specs() -> None:
    with FakeServer() as srv:
        spec = LoadSpec(num_requests=5, concurrency=None, request_rate=float("inf"), warmup=0,
                        output_len=4)
        recs, _ = asyncio.run(run_load(srv.url, spec))
    assert spec.label == "rate=inf" and all(r.ok for r in recs)
    with pytest.raises(BadInput):
        LoadSpec(concurrency=None).check()
    with pytest.raises(BadInput):
        LoadSpec(api="chat").check()


def test_metric_formulas() -> None:
    r = RequestRecord(run="x", index=0, warmup=False, api="generate", input_len=1,
                      output_len_requested=5, output_len=5, ttft_s=0.1, e2el_s=0.5,
                      chunk_gaps_s=[0.1, 0.2, 0.1], chunk_tokens=[1, 2, 1])
    assert r.tpot_s == pytest.approx(0.1)
    assert r.itl_s() == pytest.approx([0.1, 0.1, 0.1, 0.1])
    st = stats([1.0, 2.0, 3.0, 4.0])
    assert st["median"] == 2.5 and st["n"] == 4 and st["p90"] == pytest.approx(3.7)
