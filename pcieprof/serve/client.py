"""Async streaming load client for SGLang's `/generate` and the OpenAI `/v1/completions` API.

Prompts are random token ids (exactly `input_len` tokens, from a fixed seed), so no tokenizer is
needed and every server sees the same prompts. `ignore_eos` makes every request produce exactly
`output_len` tokens. Timestamps are taken with `time.perf_counter()` as each SSE line arrives;
per chunk the client only finds the server's running token count in the raw bytes (SGLang's
`/generate` chunks repeat the whole text so far, so parsing each one in full costs O(n^2)).

Streaming formats (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py):
  /generate:        `data: {"text": <text so far>, "meta_info": {"completion_tokens": N, ...}}`
                    ... `data: [DONE]`
  /v1/completions:  `data: {"choices": [{"text": <delta>, ...}], ...}` ... optionally a last
                    chunk with `usage.completion_tokens`, then `data: [DONE]`
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
import orjson

from pcieprof.errors import BadInput
from pcieprof.serve.metrics import RequestRecord

APIS = ("generate", "completions")
_CT = b'"completion_tokens":'
_DIGITS = re.compile(rb" *(\d+)")


@dataclass(frozen=True)
class LoadSpec:
    """One load run.

    Attributes:
        api: `generate` (SGLang native) or `completions` (OpenAI).
        input_len: prompt tokens per request.
        output_len: tokens to generate per request (ignore_eos).
        num_requests: measured requests.
        concurrency: most requests in flight (closed loop), or None for a rate run.
        request_rate: requests/s, Poisson arrivals from the seed (inf = all at once).
        warmup: requests sent first and not counted.
        seed: seeds prompts and arrivals.
        vocab_low, vocab_high: token ids are drawn from [low, high).
        model: model name for the OpenAI API.
        timeout_s: per-request deadline.
    """

    api: str = "generate"
    input_len: int = 128
    output_len: int = 64
    num_requests: int = 16
    concurrency: int | None = 4
    request_rate: float | None = None
    warmup: int = 2
    seed: int = 0
    vocab_low: int = 0
    vocab_high: int = 256
    model: str = "default"
    timeout_s: float = 300.0

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"c={self.concurrency}"
        return f"rate={'inf' if math.isinf(self.request_rate or 0) else self.request_rate}"

    def check(self) -> None:
        if self.api not in APIS:
            raise BadInput(f"--api {self.api!r}: use one of {', '.join(APIS)}")
        if self.input_len < 1 or self.output_len < 1:
            raise BadInput("--input-len and --output-len must be at least 1")
        if self.num_requests < 1:
            raise BadInput("--num-requests must be at least 1")
        if (self.concurrency is None) == (self.request_rate is None):
            raise BadInput("give a concurrency or a request rate, not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise BadInput("concurrency must be at least 1")
        if self.request_rate is not None and not self.request_rate > 0:
            raise BadInput("--request-rate must be > 0 (inf sends all at once)")
        if self.vocab_high <= self.vocab_low:
            raise BadInput("empty token id range for prompts")


def make_prompts(n: int, input_len: int, seed: int, low: int, high: int) -> list[list[int]]:
    """`n` prompts of exactly `input_len` random token ids in [low, high), reproducible by seed."""
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(input_len)] for _ in range(n)]


def _payload(spec: LoadSpec, prompt: list[int]) -> tuple[str, bytes]:
    if spec.api == "generate":
        body = {"input_ids": prompt, "stream": True,
                "sampling_params": {"max_new_tokens": spec.output_len, "ignore_eos": True,
                                    "temperature": 0.0}}
        return "/generate", orjson.dumps(body)
    body = {"model": spec.model, "prompt": prompt, "max_tokens": spec.output_len,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    return "/v1/completions", orjson.dumps(body)


def _count_generate(data: bytes) -> int | None:
    """completion_tokens of a /generate chunk, read without parsing the whole text."""
    i = data.rfind(_CT)
    if i < 0:
        return None
    m = _DIGITS.match(data, i + len(_CT))
    return int(m.group(1)) if m else None


async def one_request(session: aiohttp.ClientSession, base_url: str, spec: LoadSpec,
                      prompt: list[int], rec: RequestRecord, t0: float) -> RequestRecord:
    """Send one streaming request and fill `rec` with its timings."""
    path, body = _payload(spec, prompt)
    st = time.perf_counter()
    rec.start_s = st - t0
    last = st
    done_at: float | None = None
    tokens = 0
    try:
        async with session.post(base_url + path, data=body,
                                headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=spec.timeout_s)) as resp:
            if resp.status != 200:
                said = (await resp.content.read(200)).decode("utf-8", "replace")
                rec.error = _printable(f"HTTP {resp.status}: {said}")
                return rec
            async for line in resp.content:
                now = time.perf_counter()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done_at = now
                    break
                if spec.api == "generate":
                    n = _count_generate(data)
                    if n is None:
                        obj = orjson.loads(data)
                        if "error" in obj:
                            rec.error = _printable(str(obj["error"]))
                            return rec
                        continue
                    new = n - tokens
                else:
                    obj = orjson.loads(data)
                    if "error" in obj:
                        rec.error = _printable(str(obj["error"]))
                        return rec
                    usage = obj.get("usage")
                    choices = obj.get("choices") or []
                    if usage and not choices:
                        tokens = int(usage.get("completion_tokens", tokens))
                        continue
                    new = 1 if choices and choices[0].get("text") else 0
                    n = tokens + new
                if new <= 0:
                    continue
                if rec.ttft_s is None:
                    rec.ttft_s = now - st
                else:
                    rec.chunk_gaps_s.append(now - last)
                    rec.chunk_tokens.append(new)
                last = now
                tokens = n
            # E2E at [DONE] when the server sends it (as bench_serving), else at the last chunk.
            rec.e2el_s = (done_at or last) - st if rec.ttft_s is not None else None
            rec.output_len = tokens
            if rec.ttft_s is None:
                rec.error = "stream ended without tokens"
    except asyncio.TimeoutError:
        rec.error = f"timeout after {spec.timeout_s:.0f} s"
    except aiohttp.ClientError as exc:  # refused, reset, garbage or truncated HTTP
        rec.error = _printable(f"{type(exc).__name__}: {exc}")
    except (ValueError, AttributeError, TypeError) as exc:  # malformed data in the stream
        rec.error = _printable(f"bad stream data: {type(exc).__name__}: {exc}")
    return rec


def _printable(text: str, limit: int = 300) -> str:
    """One line of at most `limit` characters a terminal shows as it is: whatever a server sent
    (control characters, escape sequences, bytes that are not text) is replaced by `?`."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


async def run_load(base_url: str, spec: LoadSpec, *,
                   on_done: Callable[[RequestRecord], None] | None = None,
                   connector_limit: int = 0) -> tuple[list[RequestRecord], float]:
    """Run warm-up then the measured requests of `spec` against `base_url`.

    Args:
        base_url: `http://host:port`.
        spec: the run.
        on_done: called with each finished request (warm-up included), as it finishes.
        connector_limit: aiohttp connection limit (0: unlimited).

    Returns:
        (all records, warm-up first; measured duration in seconds).
    """
    spec.check()
    base_url = base_url.rstrip("/")
    prompts = make_prompts(spec.warmup + spec.num_requests, spec.input_len, spec.seed,
                           spec.vocab_low, spec.vocab_high)
    records = [RequestRecord(run=spec.label, index=i, warmup=i < spec.warmup, api=spec.api,
                             input_len=spec.input_len, output_len_requested=spec.output_len)
               for i in range(len(prompts))]
    conn = aiohttp.TCPConnector(limit=connector_limit, force_close=False)
    async with aiohttp.ClientSession(connector=conn, read_bufsize=1 << 16) as session:
        t0 = time.perf_counter()

        async def go(i: int) -> None:
            await one_request(session, base_url, spec, prompts[i], records[i], t0)
            if on_done:
                on_done(records[i])

        width = spec.concurrency or max(1, spec.warmup)
        await _closed_loop(go, list(range(spec.warmup)), width)
        measured = list(range(spec.warmup, len(prompts)))
        t_start = time.perf_counter()
        if spec.concurrency is not None:
            await _closed_loop(go, measured, spec.concurrency)
        else:
            assert spec.request_rate is not None  # LoadSpec: one of the two is set
            await _open_loop(go, measured, float(spec.request_rate), spec.seed)
        duration = time.perf_counter() - t_start
    return records, duration


async def _closed_loop(go: Callable[[int], Any], items: list[int], width: int) -> None:
    sem = asyncio.Semaphore(width)

    async def one(i: int) -> None:
        async with sem:
            await go(i)

    await asyncio.gather(*(one(i) for i in items))


async def _open_loop(go: Callable[[int], Any], items: list[int], rate: float, seed: int) -> None:
    rng = random.Random(seed + 1)
    tasks = []
    for i in items:
        tasks.append(asyncio.create_task(go(i)))
        if not math.isinf(rate):
            await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
