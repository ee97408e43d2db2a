"""Launch attempts: start a config, check it serves correct tokens, record how it ended.

`--sweep` tries an ordered list of launch configurations (the card's `[[sweep]]` list, or a
user's TOML/JSON file) and stops at the first that serves correct tokens; every attempt, failed
or not, is a row of serve/attempts.jsonl with its outcome, log excerpt and time to failure.
"Correct tokens" here means: concurrent probe requests with ignore_eos each return exactly the
requested number of tokens, without an error, and the server is still alive afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pcieprof.errors import BadInput
from pcieprof.cards import ModelCard
from pcieprof.serve.client import LoadSpec, run_load
from pcieprof.serve.launcher import ServerProcess, progress_waiter
from pcieprof.serve.outcomes import Classified, Outcome, classify
from pcieprof.serve.sglang_cmd import LaunchConfig, ServerCommand

_META = ("why", "source")


@dataclass
class SweepEntry:
    """One config of a sweep with its reason and source."""

    config: LaunchConfig
    why: str = ""
    source: str = ""


def entries_from(card: ModelCard, base: LaunchConfig, path: Path | None = None) -> list[SweepEntry]:
    """The sweep list: from `path` (TOML with [[sweep]] tables, or a JSON list) else the card's.

    Each entry's fields override `base` (which carries the user's layout, port and extras).

    Raises:
        BadInput: an unreadable file, an empty list or unknown fields.
    """
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
            raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text).get("sweep", [])
        except (OSError, ValueError) as exc:
            raise BadInput(f"{path}: unreadable sweep file ({exc})") from None
    else:
        raw = list(card.sweep)
    if not raw:
        raise BadInput(f"no sweep list for {card.name}",
                       hint="give --sweep-file FILE with [[sweep]] entries")
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


@dataclass
class Attempt:
    """How one launch went (one row of attempts.jsonl)."""

    index: int
    name: str
    config: dict[str, Any]
    command: dict[str, Any]
    log: str
    why: str = ""
    source: str = ""
    outcome: str = "running"
    summary: str = ""
    hint: str = ""
    excerpt: str = ""
    line: int | None = None
    exit_code: int | None = None
    time_to_ready_s: float | None = None
    time_to_failure_s: float | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    benchmarked: bool = False
    pid: int | None = None  # the server's process (and process group) id

    def fail(self, c: Classified, t0: float) -> None:
        self.outcome, self.summary, self.hint = c.outcome.value, c.summary, c.hint
        self.excerpt, self.line, self.exit_code = c.excerpt, c.line, c.exit_code
        self.time_to_failure_s = round(time.monotonic() - t0, 3)

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.OK.value

    def one_line(self) -> str:
        if self.ok:
            return f"attempt {self.index} {self.name}: ok (ready in {self.time_to_ready_s:.1f} s)"
        first = self.excerpt_key()
        return (f"attempt {self.index} {self.name}: {self.outcome} after "
                f"{self.time_to_failure_s or 0:.1f} s: {self.summary}{first}")

    def excerpt_key(self) -> str:
        for ln in self.excerpt.splitlines():
            if ln.startswith(">"):
                s = ln[1:].strip()
                return ": " + (s[:140] + "..." if len(s) > 140 else s)
        return ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def probe_tokens(base_url: str, *, tokens: int, n: int, timeout_s: float,
                       api: str = "generate", vocab_high: int = 256) -> dict[str, Any]:
    """Send `n` concurrent ignore_eos requests of `tokens` tokens; say whether all came back right."""
    spec = LoadSpec(api=api, input_len=8, output_len=tokens, num_requests=n, concurrency=n,
                    warmup=0, seed=7, vocab_high=vocab_high, timeout_s=timeout_s)
    recs, dur = await run_load(base_url, spec)
    bad = [r for r in recs if not r.ok or r.output_len != tokens]
    return {"ok": not bad, "requests": n, "tokens": tokens, "duration_s": round(dur, 3),
            "errors": [r.error or f"{r.output_len} tokens instead of {tokens}" for r in bad][:4]}


def launch(index: int, entry: SweepEntry, cmd: ServerCommand, log_path: Path, base_url: str, *,
           startup_timeout_s: float, stall_s: float | None, probe_tokens_n: int,
           probe_requests: int, probe_timeout_s: float, api: str, vocab_high: int,
           on_started: Callable[[Attempt], None] | None = None) -> tuple[Attempt, ServerProcess]:
    """Start one config, wait for readiness and probe it. The server is left running (stop it).

    `on_started` sees the attempt (outcome `running`, with the server's pid) right after the
    process started, so a record exists even if pcieprof itself is killed.

    Returns:
        The attempt (outcome `ok` when the probe passed) and its server process.
    """
    att = Attempt(index=index, name=entry.config.name, config=entry.config.to_json(),
                  command=cmd.to_json(), log=str(log_path), why=entry.why, source=entry.source)
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
                         api=api, vocab_high=vocab_high)
    except BaseException:
        server.stop()  # Ctrl-C or an error while starting: never leave the group behind
        raise
    return att, server


def _ready_and_probe(att: Attempt, server: ServerProcess, base_url: str, t0: float, *,
                     startup_timeout_s: float, stall_s: float | None, probe_tokens_n: int,
                     probe_requests: int, probe_timeout_s: float, api: str,
                     vocab_high: int) -> None:
    failure = server.wait_ready(base_url, deadline_s=startup_timeout_s, stall_s=stall_s,
                                on_wait=progress_waiter(f"attempt {att.index} {att.name}"))
    if failure is not None:
        att.fail(failure, t0)
        return
    att.time_to_ready_s = round(time.monotonic() - t0, 3)
    try:
        att.probe = asyncio.run(probe_tokens(base_url, tokens=probe_tokens_n, n=probe_requests,
                                             timeout_s=probe_timeout_s, api=api,
                                             vocab_high=vocab_high))
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
    att.fail(c, t0)


def classify_attempt_end(server: ServerProcess, *, hung: bool = False) -> Classified:
    """How a server that was serving ended (e.g. crashed during the benchmark)."""
    return classify(server.log_text(), server.exit_code(), hung=hung)
