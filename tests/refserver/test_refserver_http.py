"""The reference server's SGLang HTTP surface, against one real TP=2 server."""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[bytes]:
    events = []
    async with session.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        buf = b""
        async for chunk in r.content.iter_any():
            buf += chunk
        events = [e for e in buf.split(b"\n\n") if e]
    return events


def _gen(text: str, n: int, **sp: Any) -> dict[str, Any]:
    return {"text": text, "stream": True,
            "sampling_params": {"max_new_tokens": n, "ignore_eos": True, **sp}}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_generate_stream_is_sglang_framed(server) -> None:
    async def go() -> list[bytes]:
        async with aiohttp.ClientSession() as s:
            return await _stream(s, server.url + "/generate", _gen("Hello", 5, temperature=0))

    events = run(go())
    assert events[-1] == b"data: [DONE]"
    frames = [json.loads(e[len(b"data: "):]) for e in events[:-1]]
    assert [f["meta_info"]["completion_tokens"] for f in frames] == [1, 2, 3, 4, 5]
    assert all(f["meta_info"]["finish_reason"] is None for f in frames[:-1])
    assert frames[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert frames[-1]["meta_info"]["prompt_tokens"] == 3  # "H", "el", "lo": bigram tokenizer
    # SGLang streams the whole text so far in every event
    texts = [f["text"] for f in frames]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and len(texts[-1]) > 0
    assert len({f["meta_info"]["id"] for f in frames}) == 1


def test_greedy_is_deterministic_and_non_stream_matches(server) -> None:
    async def go() -> tuple[list[bytes], dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            ev = await _stream(s, server.url + "/generate", _gen("abc", 6, temperature=0))
            async with s.post(server.url + "/generate",
                              json={"text": "abc", "sampling_params": {
                                  "max_new_tokens": 6, "ignore_eos": True,
                                  "temperature": 0}}) as r:
                return ev, await r.json()

    events, plain = run(go())
    last = json.loads(events[-2][len(b"data: "):])
    assert plain["text"] == last["text"]
    assert plain["meta_info"]["completion_tokens"] == 6


def test_sampling_with_a_seed_is_reproducible(server) -> None:
    def body(seed: int) -> dict[str, Any]:
        return {"text": "abc", "sampling_params": {"max_new_tokens": 12, "ignore_eos": True,
                                                   "temperature": 1.0, "sampling_seed": seed}}

    async def go() -> list[str]:
        async with aiohttp.ClientSession() as s:
            out = []
            for seed in (7, 7, 8):
                async with s.post(server.url + "/generate", json=body(seed)) as r:
                    out.append((await r.json())["text"])
            return out

    a, b, c = run(go())
    assert a == b and a != c


def test_concurrent_requests_share_decode_steps(server) -> None:
    async def go() -> tuple[list[list[bytes]], dict[str, Any], str]:
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url + "/get_server_info") as r:
                before = (await r.json())["internal_states"][0]["decode_batch_size_counts"]
            outs = await asyncio.gather(*[
                _stream(s, server.url + "/generate", _gen(f"req {i}", 12))
                for i in range(6)])
            async with s.get(server.url + "/get_server_info") as r:
                info = await r.json()
            async with s.get(server.url + "/metrics") as r:
                metrics = await r.text()
            return outs, {"before": before, "info": info}, metrics

    outs, infos, metrics = run(go())
    for events in outs:
        assert len(events) == 13 and events[-1] == b"data: [DONE]"
    after = infos["info"]["internal_states"][0]["decode_batch_size_counts"]
    grown = {int(bs): n - infos["before"].get(bs, 0) for bs, n in after.items()}
    assert max(bs for bs, n in grown.items() if n > 0) > 1, after
    lines = [ln for ln in metrics.splitlines() if ln.startswith("pcieprof_refserver:decode_steps")]
    assert any('batch_size="1"' not in ln for ln in lines)
    assert "sglang:num_requests_total" in metrics
    assert "sglang:time_to_first_token_seconds_bucket" in metrics


def test_openai_completions_stream_and_usage(server) -> None:
    body = {"model": "tiny-cpu", "prompt": "hi", "max_tokens": 4, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}

    async def go() -> tuple[list[bytes], dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            ev = await _stream(s, server.url + "/v1/completions", body)
            async with s.post(server.url + "/v1/completions",
                              json={**body, "stream": False}) as r:
                return ev, await r.json()

    events, plain = run(go())
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[len(b"data: "):]) for e in events[:-1]]
    text_chunks = [c for c in chunks if c["choices"]]
    assert len(text_chunks) == 4
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in text_chunks] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert plain["usage"] == {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
    assert plain["choices"][0]["finish_reason"] == "length"


def test_server_info_says_what_it_is(server) -> None:
    async def go() -> tuple[dict[str, Any], int, int]:
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url + "/get_server_info") as r:
                info = await r.json()
            async with s.get(server.url + "/health_generate") as r:
                h = r.status
            async with s.post(server.url + "/generate",
                              json={"text": "x" * 3000, "sampling_params": {}}) as r:
                bad = r.status
            return info, h, bad

    info, health, bad = run(go())
    assert info["pcieprof_reference_server"] is True
    assert "not a serving engine" in info["note"]
    assert info["tp_size"] == 2 and info["model_config"]["collectives_per_step"]["all_reduce"] == 9
    assert health == 200
    assert bad == 400
    assert "not a serving engine" in server.log()


def _trace_summary(path: Path) -> dict[str, Any]:
    data = json.loads(gzip.open(path).read())
    ev = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("step[")]
    reduces = [e for e in ev if e["name"] == "gloo:all_reduce"]
    decode = [s for s in steps if s["name"].startswith("step[DECODE")]
    inside = [a for a in reduces
              if any(s["ts"] <= a["ts"] and a["ts"] + a["dur"] <= s["ts"] + s["dur"]
                     for s in decode)]
    return {"steps": [s["name"] for s in steps], "reduces": len(reduces), "inside": len(inside),
            "profiler_steps": sum(e["name"].startswith("ProfilerStep#") for e in ev),
            "rank": data.get("distributedInfo", {}).get("rank")}


def test_profile_by_stage_writes_one_decode_trace_per_rank(server, tmp_path: Path) -> None:
    out = tmp_path / "traces"

    async def go() -> tuple[int, str]:
        async with aiohttp.ClientSession() as s:
            # The profile is armed before the load starts: armed during it, a fast server can
            # finish every decode step first and leave the shared server profiling for ever.
            async with s.post(server.url + "/start_profile",
                              json={"output_dir": str(out), "num_steps": 3,
                                    "profile_by_stage": True, "with_stack": False}) as r:
                status, text = r.status, await r.text()
            await asyncio.gather(*[_stream(s, server.url + "/generate", _gen(f"p{i}", 20))
                                   for i in range(3)])
            return status, text

    status, text = run(go())
    assert (status, text) == (200, "Start profiling.\n")
    deadline = time.time() + 120
    while time.time() < deadline and len(list(out.glob("*-DECODE.trace.json.gz"))) < 2:
        time.sleep(0.2)
    # By stage, the prefill (EXTEND) steps are profiled apart from the decode steps, as SGLang does.
    assert sorted(f.name.split("-TP-")[1] for f in out.glob("*.trace.json.gz")) == [
        "0-DECODE.trace.json.gz", "0-EXTEND.trace.json.gz",
        "1-DECODE.trace.json.gz", "1-EXTEND.trace.json.gz"]
    files = sorted(out.glob("*-DECODE.trace.json.gz"))
    names = [f.name for f in files]
    assert names[0].endswith("-TP-0-DECODE.trace.json.gz"), names
    assert names[1].endswith("-TP-1-DECODE.trace.json.gz")
    assert names[0].split("-TP-")[0] == names[1].split("-TP-")[0]  # one profile id
    assert not list(out.glob(".*"))  # no partial files left behind
    for rank, f in enumerate(files):
        summary = _trace_summary(f)
        decode = [n for n in summary["steps"] if n.startswith("step[DECODE")]
        assert len(decode) == 3, summary
        assert summary["rank"] == rank
        # 1 embedding + 2 per layer x 4 layers all-reduces per step, inside the decode spans
        assert summary["inside"] >= 27 and summary["profiler_steps"] >= 3


def test_profile_then_stop_early(server, tmp_path: Path) -> None:
    out = tmp_path / "early"

    async def go() -> list[tuple[int, str]]:
        async with aiohttp.ClientSession() as s:
            res = []
            async with s.post(server.url + "/start_profile",
                              json={"output_dir": str(out), "with_stack": False}) as r:
                res.append((r.status, await r.text()))
            async with s.post(server.url + "/start_profile", json={"output_dir": str(out)}) as r:
                res.append((r.status, await r.text()))
            await _stream(s, server.url + "/generate", _gen("q", 4))
            async with s.post(server.url + "/stop_profile") as r:
                res.append((r.status, await r.text()))
            async with s.post(server.url + "/stop_profile") as r:
                res.append((r.status, await r.text()))
            return res

    res = run(go())
    assert res[0] == (200, "Start profiling.\n")
    assert res[1][0] == 400 and "already in progress" in res[1][1]
    assert res[2] == (200, "Stop profiling. This will take some time.\n")
    assert res[3][0] == 400 and "not in progress" in res[3][1]
    names = sorted(f.name for f in out.glob("*.trace.json.gz"))  # written before the reply
    assert [n.split("-TP-")[1] for n in names] == ["0.trace.json.gz", "1.trace.json.gz"]
    assert _trace_summary(out / names[1])["reduces"] >= 9 * 4


@pytest.mark.parametrize("flag", ["--nnodes", "--bogus-flag"])
def test_unknown_and_unsupported_flags_are_refused(flag: str) -> None:
    from pcieprof.refserver.args import ArgsError, parse_args

    with pytest.raises(ArgsError) as err:
        parse_args([flag, "2"])
    assert flag in str(err.value)


def test_tp1_equals_tp2_and_queues_past_max_running(server, start_server) -> None:
    """The sharded model (column/row-parallel + all-reduce) computes what the unsharded one
    does; requests beyond --max-running-requests wait; a client that leaves mid-stream does not
    disturb the others."""
    body = {"text": "the quick brown fox", "sampling_params": {"max_new_tokens": 8,
                                                              "temperature": 0,
                                                              "ignore_eos": True}}
    one = start_server(["--max-running-requests", "2"], tp=1)
    one.wait_ready()

    async def go() -> tuple[str, str, list[list[bytes]], dict[str, Any]]:
        async with aiohttp.ClientSession() as sess:
            texts = []
            for url in (one.url, server.url):
                async with sess.post(url + "/generate", json=body) as r:
                    texts.append((await r.json())["text"])
            async with sess.post(one.url + "/generate", json=_gen("gone", 200)) as r:
                await r.content.readline()
            outs = await asyncio.gather(*[_stream(sess, one.url + "/generate", _gen(f"q{i}", 6))
                                          for i in range(5)])
            async with sess.get(one.url + "/get_server_info") as r:
                state = (await r.json())["internal_states"][0]
            return texts[0], texts[1], outs, state

    tp1, tp2, outs, state = run(go())
    assert tp1 == tp2 and len(tp1) >= 8
    assert all(len(o) == 7 for o in outs)
    assert state["max_decode_batch_size"] == 2
    assert state["#running-req"] == 0


def test_killing_rank0_leaves_no_rank_behind(server) -> None:
    """Last in this module: SIGKILL only rank 0; its ranks must die with it (PDEATHSIG)."""
    ranks = server.ranks
    assert len(ranks) >= 1  # TP1
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=60)
    assert server.all_gone(ranks, timeout=60), ranks
