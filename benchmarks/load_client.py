"""Ingest capacity of serve-bench's load client against a peer client, same server, one run.

The server is tests/builders/fakeserver.py (test-only) in its own process, streaming
SGLang-shaped `/generate` chunks with no delay, so what limits a run is how many tokens per second
a client can receive and timestamp. Peers:
  - SGLang's own bench_serving client (`sglang.benchmark.serving.async_request_sglang_generate`)
    when it can be imported here (it needs sglang's runtime imports: triton, transformers);
  - else the plainest aiohttp client: read each SSE line, `orjson.loads` it, take a timestamp.
Clients run alternately (A B A B ...) and the best of the rounds is compared.

    python benchmarks/load_client.py [--requests 64] [--concurrency 16] [--output-len 512]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import orjson

from pcieprof.serve.client import LoadSpec, run_load
from pcieprof.serve.launcher import free_port, http_get

# Test-only, so it lives beside the tests, not in the package.
FAKE_SERVER = Path(__file__).resolve().parent.parent / "tests" / "builders" / "fakeserver.py"


async def plain_aiohttp(url: str, n: int, conc: int, out_len: int, in_len: int) -> int:
    """The simplest client that still times every chunk: returns tokens received."""
    sem = asyncio.Semaphore(conc)
    total = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal total
        body = {"input_ids": list(range(in_len)), "stream": True,
                "sampling_params": {"max_new_tokens": out_len, "ignore_eos": True}}
        stamps = []
        last = 0
        async with sem, session.post(url + "/generate", json=body) as r:
            async for line in r.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = orjson.loads(data)
                stamps.append(time.perf_counter())
                last = obj["meta_info"]["completion_tokens"]
        total += last

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session) for _ in range(n)))
    return total


async def pcieprof_client(url: str, n: int, conc: int, out_len: int, in_len: int) -> int:
    spec = LoadSpec(input_len=in_len, output_len=out_len, num_requests=n, concurrency=conc,
                    warmup=0)
    recs, _ = await run_load(url, spec)
    bad = [r.error for r in recs if not r.ok]
    if bad:
        raise RuntimeError(f"pcieprof client errors: {bad[:2]}")
    return sum(r.output_len for r in recs)


def sglang_client() -> tuple[Callable[..., Awaitable[int]] | None, str]:
    """SGLang's bench_serving request function, or None and the reason it cannot run here."""
    try:
        import types
        import importlib.util

        spec = importlib.util.find_spec("sglang")
        if spec is None:
            path = os.environ.get("PCIEPROF_SGLANG_PATH") or os.path.expanduser(
                "~/.cache/pcieprof/sglang-0.5.23")
            sys.path.insert(0, path)
            spec = importlib.util.find_spec("sglang")
        if spec is None:
            return None, "sglang is not installed"
        if "sglang" not in sys.modules:
            pkg = types.ModuleType("sglang")
            pkg.__path__ = list(spec.submodule_search_locations or [])
            sys.modules["sglang"] = pkg
        import sglang.benchmark.serving as bs  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 (any import failure means: use the plain peer)
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"

    async def run(url: str, n: int, conc: int, out_len: int, in_len: int) -> int:
        bs.set_global_args(argparse.Namespace(temperature=0.0, disable_ignore_eos=False,
                                              top_p=1.0, disable_stream=False,
                                              return_logprob=False, return_routed_experts=False,
                                              logprob_start_len=-1, top_logprobs_num=0,
                                              token_ids_logprob=None, cache_report=False))
        sem = asyncio.Semaphore(conc)
        outs = []

        async def one() -> None:
            inp = bs.RequestFuncInput(prompt=list(range(in_len)), api_url=url + "/generate",
                                      prompt_len=in_len, output_len=out_len, model="x",
                                      lora_name=None, image_data=None, extra_request_body={})
            async with sem:
                outs.append(await bs.async_request_sglang_generate(inp))

        await asyncio.gather(*(one() for _ in range(n)))
        return sum(o.output_len for o in outs if o.success)

    return run, "sglang.benchmark.serving.async_request_sglang_generate"


def measure(fn: Callable[..., Awaitable[int]], url: str,
            args: argparse.Namespace) -> tuple[float, float, int]:
    """(tokens per client CPU second, tokens per wall second, tokens).

    The server is another process, so this process's CPU time is the client's own cost: tokens
    per CPU second is the ingest capacity the client would have if the server were infinitely
    fast; per wall second is what this run achieved (bounded by the fake server on a busy box).
    """
    t, c = time.perf_counter(), time.process_time()
    tokens = asyncio.run(fn(url, args.requests, args.concurrency, args.output_len, args.input_len))
    dt, dc = time.perf_counter() - t, time.process_time() - c
    return tokens / dc, tokens / dt, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    port = free_port(start=41000)
    server = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", str(port)],
                              stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while http_get(url + "/health")[0] != 200:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("fake server did not start")
            time.sleep(0.1)
        peer, peer_name = sglang_client()
        if peer is None:
            print(f"SGLang's bench_serving client cannot run here ({peer_name}); "
                  f"peer: the plainest aiohttp client")
            peer, peer_name = plain_aiohttp, "plain aiohttp + orjson per chunk"
        # Warm both paths once (imports, connection setup).
        small = argparse.Namespace(**{**vars(args), "requests": 4, "output_len": 16})
        measure(pcieprof_client, url, small)
        measure(peer, url, small)
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(args.rounds):
            for name, fn in (("pcieprof", pcieprof_client), ("peer", peer)):
                r = measure(fn, url, args)
                if name not in best or r[0] > best[name][0]:
                    best[name] = r
        ours, theirs = best["pcieprof"], best["peer"]
        print(f"server: tests/builders/fakeserver.py in its own process (no delay), {args.requests} "
              f"requests x {args.output_len} tokens, concurrency {args.concurrency}, "
              f"best of {args.rounds}")
        print(f"{'client':<36} {'tok per client CPU-s':>21} {'tok per wall-s':>15} {'tokens':>7}")
        for label, (cpu, wall, n) in (("pcieprof.serve.client", ours), (peer_name, theirs)):
            print(f"{label:<36} {cpu:>21,.0f} {wall:>15,.0f} {n:>7}")
        print(f"ratio pcieprof / peer: {ours[0] / theirs[0]:.2f}x ingest capacity (CPU), "
              f"{ours[1] / theirs[1]:.2f}x wall")
    finally:
        os.killpg(server.pid, 15)
        server.wait(10)


if __name__ == "__main__":
    main()
