"""Launch attempts: start a config, check it serves correct tokens, record how it ended.

An attempt is one launch: its configuration (chosen by the launch search, pcieprof.tune.search,
or taken from a user's `--sweep-file` list), its outcome, the log lines behind it and its time to
failure; every attempt is a row of serve/attempts.jsonl. "Correct tokens": concurrent /generate
probes with ignore_eos each return exactly the requested number of tokens, not all one token,
with finite log-probabilities, and the server is still alive afterwards.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import aiohttp

from pcieprof import aio
from pcieprof.bundle.serve_search import Attempt, Outcome, SearchStep
from pcieprof.errors import BadInput
from pcieprof.redact import redact
from pcieprof.serve.launcher import ServerProcess, progress_waiter
from pcieprof.serve.outcomes import Classified, classify
from pcieprof.serve.sglang_cmd import LaunchConfig, ServerCommand

_META = ("why", "source")


@dataclass
class SweepEntry:
    """One config to launch, with its reason and source.

    Attributes:
        config: the launch configuration.
        why: why it is tried.
        source: where the reason comes from.
        search: for a launch-search step: its configuration by axis, rule, parent, varied axes
            and changes (recorded with the attempt, so that a search can resume); else None.
    """

    config: LaunchConfig
    why: str = ""
    source: str = ""
    search: SearchStep | None = None


def entries_from(base: LaunchConfig, path: Path) -> list[SweepEntry]:
    """A user's list of configs (`--sweep-file`): TOML with [[sweep]] tables, or a JSON list.

    Each entry's fields override `base` (which carries the user's layout, port and extras).

    Raises:
        BadInput: an unreadable file, an empty list or unknown fields.
    """
    try:
        text = path.read_text(encoding="utf-8")
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text).get("sweep", [])
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: unreadable sweep file ({exc})") from None
    if not raw:
        raise BadInput(f"{path}: no [[sweep]] entries")
    out = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise BadInput(f"sweep entry {i} is not a table")
        fields = {k: v for k, v in e.items() if k not in _META}
        fields.setdefault("name", f"config-{i}")
        merged = {**base.to_json(), **fields}
        if "extra_args" in fields:
            merged["extra_args"] = list(base.extra_args) + list(fields["extra_args"])
        if "env" in fields:
            merged["env"] = {**base.env, **fields["env"]}
        out.append(SweepEntry(LaunchConfig.from_json(merged), str(e.get("why", "")),
                              str(e.get("source", ""))))
    return out


def record_failure(att: Attempt, c: Classified, t0: float) -> None:
    """Record on `att` how its server failed (`c`), `t0` being its launch (time.monotonic)."""
    att.outcome, att.summary, att.hint = c.outcome.value, c.summary, c.hint
    att.excerpt, att.line, att.exit_code = c.excerpt, c.line, c.exit_code
    att.time_to_failure_s = round(time.monotonic() - t0, 3)


async def probe_tokens(base_url: str, *, tokens: int, n: int, timeout_s: float,
                       vocab_high: int = 256, seed: int = 7) -> dict[str, Any]:
    """Check that the server generates correct tokens: `n` concurrent non-streamed /generate
    requests of `tokens` tokens (ignore_eos, return_logprob, seeded sampling).

    A request is right when it answers 200 with exactly `tokens` tokens, its tokens are not all
    one token (a NaN-poisoned sampler tends to repeat one), and every log-probability the server
    returns is a finite number.

    Returns:
        {"ok", "requests", "tokens", "duration_s", "distinct_tokens" (per request),
         "errors" (up to 4 lines)}.
    """
    rng = random.Random(seed)
    errors: list[str] = []
    distinct: list[int] = []

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {"input_ids": [rng.randrange(1, vocab_high) for _ in range(8)],
                "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True,
                                    "temperature": 1.0, "sampling_seed": seed + i},
                "return_logprob": True, "stream": False}
        try:
            async with session.post(base_url.rstrip("/") + "/generate", json=body) as r:
                if r.status != 200:
                    errors.append(f"HTTP {r.status}: {(await r.text())[:160]}")
                    return
                out = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            errors.append(f"timeout after {timeout_s:g} s" if isinstance(exc, asyncio.TimeoutError)
                          else f"{type(exc).__name__}: {exc}"[:200])
            return
        errors.extend(_check_output(out, tokens, distinct))

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        await asyncio.gather(*(one(session, i) for i in range(n)))
    return {"ok": not errors, "requests": n, "tokens": tokens,
            "duration_s": round(time.perf_counter() - t0, 3), "distinct_tokens": distinct,
            "errors": errors[:4]}


def _check_output(out: Any, tokens: int, distinct: list[int]) -> list[str]:
    """What is wrong with one /generate answer (SGLang's shape: text, output_ids, meta_info)."""
    if not isinstance(out, dict):
        return ["the answer is not a JSON object"]
    meta = out.get("meta_info") or {}
    got = meta.get("completion_tokens")
    if got != tokens:
        return [f"{got} tokens instead of {tokens}"]
    ids = out.get("output_ids")
    if isinstance(ids, list) and ids:
        distinct.append(len(set(ids)))
        if tokens >= 4 and len(set(ids)) == 1:
            return [f"degenerate output: token {ids[0]} {tokens} times"]
    elif tokens >= 4 and len(set(str(out.get("text", "")))) <= 1:
        return [f"degenerate output: {str(out.get('text', ''))[:40]!r}"]
    for lp in meta.get("output_token_logprobs") or []:
        v = lp[0] if isinstance(lp, list) and lp else lp
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            return [f"non-finite log-probability {v!r}"]
    return []


def launch(index: int, entry: SweepEntry, cmd: ServerCommand, log_path: Path, base_url: str, *,
           startup_timeout_s: float, stall_s: float | None, probe_tokens_n: int,
           probe_requests: int, probe_timeout_s: float, vocab_high: int,
           on_started: Callable[[Attempt], None] | None = None) -> tuple[Attempt, ServerProcess]:
    """Start one config, wait for readiness and probe it. The server is left running (stop it).

    `on_started` sees the attempt (outcome `running`, with the server's pid) right after the
    process started, so a record exists even if pcieprof itself is killed.

    Returns:
        The attempt (outcome `ok` when the probe passed) and its server process.
    """
    att = Attempt(index=index, name=entry.config.name, config=redact(entry.config.to_json()),
                  command=cmd.record(), log=str(log_path), why=entry.why, source=entry.source,
                  search=entry.search)
    server = ServerProcess(cmd, log_path)
    t0 = time.monotonic()
    server.start()
    att.pid = server.pid
    try:
        if on_started:
            on_started(att)
        _ready_and_probe(att, server, base_url, t0, startup_timeout_s=startup_timeout_s,
                         stall_s=stall_s, probe_tokens_n=probe_tokens_n,
                         probe_requests=probe_requests, probe_timeout_s=probe_timeout_s,
                         vocab_high=vocab_high)
    except BaseException:
        server.stop()  # Ctrl-C or an error while starting: never leave the group behind
        raise
    finally:
        if server.progress is not None:
            att.last_progress = server.progress.last_progress
    return att, server


def _ready_and_probe(att: Attempt, server: ServerProcess, base_url: str, t0: float, *,
                     startup_timeout_s: float, stall_s: float | None, probe_tokens_n: int,
                     probe_requests: int, probe_timeout_s: float, vocab_high: int) -> None:
    failure = server.wait_ready(base_url, deadline_s=startup_timeout_s, stall_s=stall_s,
                                on_wait=progress_waiter(f"attempt {att.index} {att.name}"))
    if failure is not None:
        record_failure(att, failure, t0)
        return
    att.time_to_ready_s = round(time.monotonic() - t0, 3)
    try:
        att.probe = aio.run(probe_tokens(base_url, tokens=probe_tokens_n, n=probe_requests,
                                             timeout_s=probe_timeout_s, vocab_high=vocab_high))
    except OSError as exc:
        att.probe = {"ok": False, "errors": [str(exc)]}
    time.sleep(0.2)  # a crash right after the last token shows up in the exit status
    if att.probe.get("ok") and server.alive():
        att.outcome, att.summary = Outcome.OK.value, "served correct tokens"
        return
    hung = server.alive() and any("timeout" in e for e in att.probe.get("errors", []))
    c = server.classify(hung=hung)
    if c.outcome is Outcome.CRASHED and server.alive():
        c = Classified(Outcome.BAD_OUTPUT, "served wrong tokens",
                       "check the probe errors in attempts.jsonl",
                       "\n".join("> " + e for e in att.probe.get("errors", [])), None, None)
    record_failure(att, c, t0)


def classify_attempt_end(server: ServerProcess, *, hung: bool = False) -> Classified:
    """How a server that was serving ended (e.g. crashed during the benchmark)."""
    return classify(server.log_text(), server.exit_code(), hung=hung)
