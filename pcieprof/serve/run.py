"""The serve-bench pipeline: launch (or attach), load sweep, decode curve, traces.

What is launched: the given configuration, a user's list (`--sweep-file`), or the launch search
(`--sweep`, pcieprof.tune.search, handed in as a Plan), which picks each next configuration from
how the earlier ones ended and resumes from the attempts recorded in the bundle (`--resume`).

Everything lands in the bundle as it is measured (serve/attempts.jsonl, serve/search.json,
serve/server-<n>.log, serve/requests.jsonl, serve/summary.json, serve/decode_curve.csv,
serve/traces/), so a crash or Ctrl-C leaves a partial bundle with all that was measured so far.
Every server started here is stopped on the way out, whatever happens. Attributing the traces is
analysis: the serve-bench command does it after this pipeline (pcieprof.analysis.attribution).
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pcieprof import aio, progress
from pcieprof.bundle import Bundle
from pcieprof.bundle.rows import DecodeCurveRow
from pcieprof.bundle.serve_search import (ATTEMPTS_FILE, NOT_A_RESULT, Attempt, Outcome, SearchEnd,
                                          attempts_jsonl, read_attempts)
from pcieprof.bundle.serve_command import RecordedCommand
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.bundle.server_info import ServerInfo
from pcieprof.bundle.served_card import ServedCard
from pcieprof.cards import LaunchTarget, ModelCard
from pcieprof.errors import BadInput, ExitCode, PcieprofError
from pcieprof.redact import redact
from pcieprof.serve import decode_curve, profiling
from pcieprof.serve.client import LoadSpec, run_load
from pcieprof.serve.launcher import ServerProcess, free_port, http_get
from pcieprof.serve.metrics import FORMULAS, RequestRecord, summarize
from pcieprof.serve.sglang_cmd import (LaunchConfig, LaunchPrefix, ParserSpec, build_command,
                                       recorded_env)
from pcieprof.serve.sweep import (SweepEntry, classify_attempt_end, entries_from, launch,
                                  record_failure)


@dataclass
class BenchOptions:
    """What serve-bench does (see the command's --help for each)."""

    card: ModelCard
    base: LaunchConfig
    plan: Plan | None = None  # --sweep: the launch search (pcieprof.commands.launch_plan)
    resume: bool = False  # continue the search recorded in the bundle
    sweep_file: Path | None = None
    prefix: LaunchPrefix | None = None
    fresh_port: bool = False  # no --port given: each attempt takes a port free at its start
    url: str | None = None
    api: str = "generate"
    concurrencies: tuple[int, ...] = (1, 4, 16, 64)
    request_rate: float | None = None
    num_requests: int | None = None
    warmup: int = 2
    input_len: int = 128
    output_len: int = 64
    seed: int = 0
    decode_batches: tuple[int, ...] = decode_curve.DEFAULT_BATCHES
    decode_output_len: int = 64
    profile: bool = True
    profile_steps: int = 8
    trace_dir: Path | None = None
    startup_timeout_s: float = 1800.0
    stall_s: float | None = None
    probe_tokens: int = 32
    probe_requests: int = 2
    probe_timeout_s: float = 60.0
    request_timeout_s: float = 600.0
    parser: ParserSpec | None = None
    target: LaunchTarget | None = None  # the box: the card's box settings that hold there
    vocab_high: int = 256
    runs: list[dict[str, Any]] = field(default_factory=list)


#: Deadline of each request attach mode makes before the load (health, server info), seconds
#: (or --request-timeout when shorter).
ATTACH_TIMEOUT_S = 30.0


class _Stop(Exception):
    """The server died during the benchmark; carries how."""

    def __init__(self, attempt: Attempt) -> None:
        super().__init__(attempt.one_line())
        self.attempt = attempt


def run(bundle: Bundle, opts: BenchOptions) -> ServeSummary | None:
    """Run serve-bench into `bundle`; returns serve/summary.json (None on a follower node).

    Raises:
        PcieprofError: no config served (exit 1), or the server crashed during the benchmark.
    """
    bundle.set_part("serve", "running", model=opts.card.name)
    bundle.write_doc(ServedCard(name=opts.card.name,
                                path=str(opts.card.path) if opts.card.path else None))
    if opts.url:
        return _attached(bundle, opts)
    if opts.base.node_rank > 0:
        _follower_node(bundle, opts)
        return None
    attempts = _resumed(bundle) if opts.resume else []
    plan: Plan
    if opts.plan is not None:
        plan = opts.plan
    elif opts.sweep_file is not None:
        plan = _ListPlan(entries_from(opts.base, opts.sweep_file))
    else:
        plan = _ListPlan([SweepEntry(opts.base, why="the given configuration")])
    try:
        return _attempt_all(bundle, opts, plan, attempts)
    except KeyboardInterrupt:
        for a in attempts:
            if a.outcome == "running" or (a.benchmarked and a.ok and not _finished(bundle)):
                a.outcome, a.summary = Outcome.INTERRUPTED.value, "interrupted (Ctrl-C)"
        _write_attempts(bundle, attempts)
        plan.record(bundle, attempts, status="interrupted", why="interrupted (Ctrl-C); "
                    "serve-bench --sweep --resume --out <this bundle> continues")
        raise


class Plan:
    """Where the configurations come from: a fixed list (below), or the launch search, which the
    command hands in (pcieprof.commands.launch_plan: the search decides, this pipeline launches).
    """

    #: True for the launch search (the messages name serve/search.json).
    searched = False

    def next(self, attempts: list[Attempt]) -> SweepEntry | SearchEnd:
        """The next configuration to launch after `attempts`, or the end."""
        raise NotImplementedError

    def record(self, bundle: Bundle, attempts: list[Attempt], *, status: str = "",
               why: str = "", end: SearchEnd | None = None) -> None:
        """Write what the plan knows into the bundle (the search writes serve/search.json)."""


class _ListPlan(Plan):
    def __init__(self, entries: list[SweepEntry]) -> None:
        self.entries = entries

    def next(self, attempts: list[Attempt]) -> SweepEntry | SearchEnd:
        done = [a for a in attempts if a.outcome not in NOT_A_RESULT]
        if len(done) < len(self.entries):
            return self.entries[len(done)]
        return SearchEnd("exhausted", f"none of {len(self.entries)} launch configs served correct "
                                      f"tokens", "see serve/attempts.jsonl")


def _resumed(bundle: Bundle) -> list[Attempt]:
    """The attempts recorded in the bundle; one left `running` (pcieprof was killed) counts as
    interrupted."""
    path = bundle.path / ATTEMPTS_FILE
    rows = read_attempts(path.read_text(encoding="utf-8"), str(path)) if path.is_file() else []
    if rows and not all(r.search for r in rows):
        raise BadInput(f"{bundle.path} holds attempts that no launch search made",
                       hint="--resume continues a serve-bench --sweep bundle")
    for r in rows:
        if r.outcome == "running":
            r.outcome, r.summary = Outcome.INTERRUPTED.value, "pcieprof stopped during it"
    if rows:
        done = [r for r in rows if r.outcome not in NOT_A_RESULT]
        progress.info(f"resuming the launch search: {len(done)} attempt(s) recorded, "
                      f"{len(rows) - len(done)} interrupted")
    return rows


def _finished(bundle: Bundle) -> bool:
    summary = bundle.read_doc(ServeSummary)
    return summary is not None and summary.status == "ok"


def _attempt_all(bundle: Bundle, opts: BenchOptions, plan: Plan,
                 attempts: list[Attempt]) -> ServeSummary:
    while True:
        entry = plan.next(attempts)
        if isinstance(entry, SearchEnd):
            return _none_served(bundle, opts, plan, attempts, entry)
        i, base_url, att, server = _launch_entry(bundle, opts, plan, entry, attempts)
        try:
            _write_attempts(bundle, attempts)
            plan.record(bundle, attempts)
            progress.info(att.one_line())
            if not att.ok:
                continue
            att.benchmarked = True
            _write_attempts(bundle, attempts)
            try:
                summary = _benchmark(bundle, opts, base_url, server, att,
                                     nranks=_local_ranks(entry.config, opts.card))
            except _Stop as stop:
                _write_attempts(bundle, attempts)
                plan.record(bundle, attempts)
                if not isinstance(plan.next(attempts), SearchEnd):
                    progress.warn(stop.attempt.one_line() + "; trying the next config")
                    continue
                bundle.set_part("serve", "partial", why=stop.attempt.one_line(),
                                model=opts.card.name, attempts=len(attempts))
                a = stop.attempt
                raise PcieprofError(f"server {a.outcome} after {a.time_to_failure_s or 0:.1f} s "
                                    f"while benchmarking: {a.summary}{a.excerpt_key()}",
                                    hint=f"{a.hint + '; ' if a.hint else ''}log: {a.log}",
                                    exit_code=ExitCode.FAILURE) from None
            status, why = _served_status(summary)
            bundle.set_part("serve", status, why=why, model=opts.card.name,
                            attempts=len(attempts), served_by=att.name)
            plan.record(bundle, attempts)
            return summary
        finally:
            rc = server.stop()
            progress.debug(f"attempt {i}: server group stopped (exit {rc})")


#: Launches of one configuration whose port was taken between the check and the server's bind
#: (another server starting at the same time): each is made again on a port free then, this many
#: times at most. Only without --port (a port the user named is theirs to free).
PORT_TAKEN_RETRIES = 3


def _launch_entry(bundle: Bundle, opts: BenchOptions, plan: Plan, entry: SweepEntry,
                  attempts: list[Attempt]) -> tuple[int, str, Attempt, ServerProcess]:
    """Start the server of one configuration (its attempt recorded as it starts); (attempt index,
    base URL, attempt, server)."""
    retries = 0
    while True:
        i = len(attempts)
        if opts.fresh_port:  # another process may have taken the last one meanwhile
            entry.config = entry.config.with_(port=free_port(_client_host(entry.config.host)))
        cmd = build_command(opts.card, entry.config, parser=opts.parser, prefix=opts.prefix,
                            target=opts.target)
        if not bundle.has("serve/command.json"):
            bundle.write_doc(cmd.record(recorded_env(cmd)))
        base_url = f"http://{_client_host(entry.config.host)}:{entry.config.port}"
        rule = entry.search.rule if entry.search else ""
        progress.info(f"attempt {i} {entry.config.name}" + (f" [{rule}]: {entry.why}" if rule
                                                            else ""))
        for change in entry.search.changes if entry.search else []:
            progress.debug(f"  {change}")
        progress.debug(f"attempt {i}: {cmd.shell()}")

        def started(a: Attempt) -> None:
            attempts.append(a)
            _write_attempts(bundle, attempts)
            plan.record(bundle, attempts)

        bundle.register(f"serve/server-{i}.log")  # a file written by the server
        att, server = launch(i, entry, cmd, bundle.file(f"serve/server-{i}.log"), base_url,
                             startup_timeout_s=opts.startup_timeout_s, stall_s=opts.stall_s,
                             probe_tokens_n=opts.probe_tokens, probe_requests=opts.probe_requests,
                             probe_timeout_s=opts.probe_timeout_s, vocab_high=opts.vocab_high,
                             on_started=started)
        taken = opts.fresh_port and att.outcome == Outcome.PORT_IN_USE.value
        if not taken or retries == PORT_TAKEN_RETRIES:
            return i, base_url, att, server
        retries += 1
        _write_attempts(bundle, attempts)
        plan.record(bundle, attempts)
        progress.warn(f"{att.one_line()}: port {entry.config.port} was free when checked and taken "
                      f"before the server bound it; the same configuration again, on a port free now")
        server.stop()


def _none_served(bundle: Bundle, opts: BenchOptions, plan: Plan, attempts: list[Attempt],
                 end: SearchEnd) -> NoReturn:
    done = [a for a in attempts if a.outcome not in NOT_A_RESULT]
    plan.record(bundle, attempts, end=end)
    bundle.set_part("serve", "failed", why=f"no configuration served correct tokens "
                    f"({len(done)} attempt(s)): {end.why}", model=opts.card.name,
                    attempts=len(done))
    last = done[-1] if done else None
    if last is not None and len(done) == 1 and not plan.searched:
        raise PcieprofError(f"server {last.outcome} after {last.time_to_failure_s or 0:.1f} s: "
                            f"{last.summary}{last.excerpt_key()}",
                            hint=f"{last.hint + '; ' if last.hint else ''}log: {last.log}",
                            exit_code=ExitCode.FAILURE)
    searched = plan.searched
    what = "launch search" if searched else "launch configs"
    see = "see serve/search.json" if searched else "see serve/attempts.jsonl"
    raise PcieprofError(f"no configuration served correct tokens ({what}, {len(done)} attempts): "
                        f"{end.why}" + (f"; last: {last.one_line()}" if last else ""),
                        hint=f"{end.hint}; {see}" if end.hint else see,
                        exit_code=ExitCode.FAILURE)


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _local_ranks(cfg: LaunchConfig, card: ModelCard) -> int:
    tp = cfg.tp or card.sglang.tp_default
    return max(1, tp * (cfg.pp or 1) // max(1, cfg.nnodes))


def _write_attempts(bundle: Bundle, attempts: list[Attempt]) -> None:
    bundle.write_text(ATTEMPTS_FILE, attempts_jsonl(attempts))


# -- attaching / follower nodes -------------------------------------------------------------------


def _attached(bundle: Bundle, opts: BenchOptions) -> ServeSummary:
    url = opts.url.rstrip("/")  # type: ignore[union-attr]
    shown = redact(url)  # what is recorded and printed: no credentials
    limit = min(ATTACH_TIMEOUT_S, opts.request_timeout_s)
    progress.info(f"attaching to {shown}: GET /health_generate (up to {limit:g} s)")
    status, _ = http_get(url + "/health_generate", timeout_s=limit)
    if status != 200:
        said = f"HTTP {status}" if status else f"no valid HTTP answer within {limit:g} s"
        bundle.set_part("serve", "failed", why=f"{shown}/health_generate: {said}")
        raise PcieprofError(f"{shown} is not serving (/health_generate: {said})",
                            hint="start the server first, or drop --url to let serve-bench launch it",
                            exit_code=ExitCode.MEASUREMENT)
    _, info = http_get(url + "/get_server_info", timeout_s=limit)
    server_info: dict[str, Any] = {}
    try:
        parsed = json.loads(info) if info else {}
        server_info = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        pass
    bundle.write_doc(ServerInfo(extra=redact(server_info)))
    try:
        tp = int(server_info.get("tp_size") or opts.base.tp or opts.card.sglang.tp_default)
    except (TypeError, ValueError):
        tp = int(opts.base.tp or opts.card.sglang.tp_default)
    att = Attempt(index=0, name="attached", config={"url": shown}, command=RecordedCommand(), log="",
                  outcome=Outcome.OK.value, summary="attached to a running server",
                  benchmarked=True)
    _write_attempts(bundle, [att])
    summary = _benchmark(bundle, opts, url, None, att, nranks=tp)
    served, why = _served_status(summary)
    bundle.set_part("serve", served, why=why, model=opts.card.name, attached=shown)
    return summary


def _follower_node(bundle: Bundle, opts: BenchOptions) -> None:
    """Node rank > 0 of a multi-node launch: run this node's server until it exits."""
    cmd = build_command(opts.card, opts.base, parser=opts.parser, prefix=opts.prefix,
                        target=opts.target)
    bundle.write_doc(cmd.record(recorded_env(cmd)))
    server = ServerProcess(cmd, bundle.file("serve/server-0.log"))
    bundle.register("serve/server-0.log")
    progress.info(f"node {opts.base.node_rank}/{opts.base.nnodes}: {cmd.shell()}")
    server.start()
    try:
        while server.alive():
            time.sleep(1.0)
    finally:
        server.stop()
    c = server.classify()
    bundle.set_part("serve", "ok" if server.exit_code() == 0 else "failed",
                    why=None if server.exit_code() == 0 else c.one_line(), node_rank=opts.base.node_rank,
                    outcome=c.outcome.value)


# -- the measurements ------------------------------------------------------------------------------


def _benchmark(bundle: Bundle, opts: BenchOptions, base_url: str, server: ServerProcess | None,
               att: Attempt, *, nranks: int) -> ServeSummary:
    backend = bundle.backend
    summary = ServeSummary(
        model=opts.card.name, tp=nranks, api=opts.api, base_url=redact(base_url),
        attempt=att.name,
        backend=backend, source=bundle.source, input_len=opts.input_len,
        output_len=opts.output_len, ignore_eos=True, seed=opts.seed,
        warmup_requests=opts.warmup, formulas=dict(FORMULAS),
        client={"python": platform.python_version(), "timestamps": "time.perf_counter at "
                "SSE line arrival"})
    if not bundle.has("serve/requests.jsonl"):
        bundle.write_text("serve/requests.jsonl", "")  # appended to by every benchmarked attempt
    req_path = bundle.file("serve/requests.jsonl")
    specs = _load_specs(opts)
    with req_path.open("a", encoding="utf-8") as req_file, \
            progress.task("load", total=sum(s.num_requests + s.warmup for s in specs)) as bar:
        def on_done(r: RequestRecord) -> None:
            req_file.write(json.dumps({"attempt": att.name, **r.to_json()}) + "\n")
            req_file.flush()
            bar.advance(1, description=f"load {r.run}")

        for spec in specs:
            recs, dur = aio.run(run_load(base_url, spec, on_done=on_done))
            s = summarize(recs, label=spec.label, concurrency=spec.concurrency,
                          request_rate=spec.request_rate, duration_s=dur)
            summary.runs.append(s)
            bundle.write_doc(summary)
            _check_alive(server, att, f"during the load run {spec.label}")
            if all(r.completed == 0 for r in summary.runs):
                _nothing_measured(bundle, summary, opts)
    if opts.decode_batches:
        def on_row(row: DecodeCurveRow) -> None:
            bundle.append_rows("decode_curve", [row])
            summary.decode_curve.append(row)
            progress.info(f"decode curve: batch {row.batch_size}: "
                          f"{row.step_time_ms:.2f} ms/step ({row.window})")

        aio.run(decode_curve.measure_curve(
            base_url, batch_sizes=opts.decode_batches, api=opts.api, input_len=16,
            output_len=opts.decode_output_len, seed=opts.seed, vocab_high=opts.vocab_high,
            backend=backend, timeout_s=opts.request_timeout_s, on_row=on_row))
        bundle.write_doc(summary)
        _check_alive(server, att, "during the decode curve")
    if opts.profile:
        summary.profile = _profile(bundle, opts, base_url, nranks, server)
        bundle.write_doc(summary)
        _check_alive(server, att, "during profiling")
    summary.status = "ok"
    bundle.write_doc(summary)
    return summary


def _nothing_measured(bundle: Bundle, summary: ServeSummary, opts: BenchOptions) -> NoReturn:
    """Every measured request so far failed: the measurement failed (exit 4), and the part
    and summary say why, with the commonest error."""
    run = summary.runs[-1]
    why = f"all {run.num_requests} requests of {run.label} failed" + _commonest(run.errors)
    summary.status = "failed"
    bundle.write_doc(summary)
    bundle.set_part("serve", "failed", why=why, model=opts.card.name)
    raise PcieprofError(why, hint="see serve/requests.jsonl", exit_code=ExitCode.MEASUREMENT)


def _commonest(errors: dict[str, int]) -> str:
    if not errors:
        return ""
    text, n = max(errors.items(), key=lambda kv: kv[1])
    return f": {text}" + (f" ({n} of them)" if len(errors) > 1 else "")


def _served_status(summary: ServeSummary) -> tuple[str, str | None]:
    """`ok`, or `partial` with the why when a load run measured nothing."""
    empty = [r for r in summary.runs if r.completed == 0]
    if not empty:
        return "ok", None
    return "partial", "; ".join(f"all {r.num_requests} requests of {r.label} failed"
                                + _commonest(r.errors) for r in empty)


def _load_specs(opts: BenchOptions) -> list[LoadSpec]:
    common = dict(api=opts.api, input_len=opts.input_len, output_len=opts.output_len,
                  warmup=opts.warmup, seed=opts.seed, vocab_high=opts.vocab_high,
                  model=opts.card.name, timeout_s=opts.request_timeout_s)
    if opts.request_rate is not None:
        n = opts.num_requests or 64
        return [LoadSpec(num_requests=n, concurrency=None, request_rate=opts.request_rate,
                         **common)]  # type: ignore[arg-type]
    return [LoadSpec(num_requests=opts.num_requests or max(2 * c, 16), concurrency=c,
                     **common) for c in opts.concurrencies]  # type: ignore[arg-type]


def _check_alive(server: ServerProcess | None, att: Attempt, when: str) -> None:
    if server is None or server.alive():
        return
    c = classify_attempt_end(server)
    record_failure(att, c, server.started_at)
    att.summary = f"{c.summary} ({when})"
    raise _Stop(att)


def _profile(bundle: Bundle, opts: BenchOptions, base_url: str, nranks: int,
             server: ServerProcess | None) -> dict[str, Any]:
    dest = bundle.path / "serve" / "traces"
    staging = opts.trace_dir or (dest / ".incoming")
    load = LoadSpec(api=opts.api, input_len=16, output_len=max(64, opts.profile_steps * 16),
                    num_requests=16, concurrency=8, warmup=0, seed=opts.seed + 99,
                    vocab_high=opts.vocab_high, timeout_s=opts.request_timeout_s)
    progress.info(f"profiling {opts.profile_steps} steps on {nranks} rank(s) via /start_profile")
    record = aio.run(profiling.capture(base_url, staging, dest, nranks=nranks,
                                           num_steps=opts.profile_steps, profile_by_stage=True,
                                           load=load, timeout_s=min(300.0, opts.request_timeout_s),
                                           alive=server.alive if server is not None else None))
    for f in record["files"]:
        bundle.register(f)  # files moved in, not written through the bundle
    bundle.write_json("serve/traces/index.json", record)  # what was asked and found
    if opts.trace_dir is None:
        try:
            staging.rmdir()
        except OSError:
            pass
    progress.info(f"traces: {len(record['files'])} file(s) from ranks {record['ranks']} "
                  f"({record['status']}{': ' + record['why'] if record['why'] else ''})")
    if record["status"] != "ok":
        bundle.set_part("serve", "partial", why=f"traces: {record['why']}")
    return record


def decode_traces(paths: list[Path]) -> list[Path]:
    """The traces to attribute: with profile_by_stage SGLang writes one file per rank and stage
    (`...-TP-<r>-EXTEND` / `-DECODE`); decode attribution wants one file per rank, the DECODE one.
    All files stay in the bundle."""
    decode = [p for p in paths if "-DECODE." in p.name]
    return decode or paths
