"""Launch (or --url attach to) SGLang or the reference server, load it, profile decode.

Server flags come from the model card, the options below and anything after `--`, e.g.
`pcieprof serve-bench --model glm5-nvfp4 --tp 8 -- --mem-fraction-static 0.9`; they are checked
against SGLang's own parser. Results: a bundle with serve/ (attempts.jsonl, server-N.log,
requests.jsonl, summary.json, decode_curve.csv, traces/).

\b
Per request (timestamps taken as each streamed chunk arrives):
  ttft_ms   time to the first chunk with text
  e2el_ms   time to the end of the stream
  tpot_ms   (e2el - ttft) / (output_tokens - 1)
  itl_ms    gap between chunks / tokens in the chunk, one value per token (SGLang convention)
Per run: request_throughput = completed / duration_s, output_throughput = output tokens /
duration_s; mean, median, p90, p99 and n of each metric. Warm-up requests are not counted.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import signal
from pathlib import Path
from typing import Any

import click

from pcieprof import progress
from pcieprof.analysis.attribution import attribute_traces
from pcieprof.analysis.decode_band import DEFAULT_MODEL
from pcieprof.bundle import Bundle, default_out_dir
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.cards import ModelCard, load_card
from pcieprof.commands.options import out_dir, verbosity
from pcieprof.errors import BadInput, EnvironmentMissing, PcieprofError
from pcieprof.schema import source_of
from pcieprof.serve.launcher import free_port
from pcieprof.serve.metrics import format_table
from pcieprof.serve.run import BenchOptions, decode_traces, run
from pcieprof.serve.sglang_cmd import (LaunchConfig, ParserSpec, build_command, load_parser,
                                       recorded_env)
from pcieprof.serve.sweep import entries_from


def _ints(text: str, what: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none", "0"):
        return ()
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BadInput(f"{what} {text!r}: give comma-separated integers, e.g. 1,4,16,64") from None
    if any(v < 1 for v in vals):
        raise BadInput(f"{what} values must be at least 1")
    return vals


def _env(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise BadInput(f"--env {p!r}: use KEY=VALUE")
        k, v = p.split("=", 1)
        out[k] = v
    return out


@click.command("serve-bench", help=__doc__, context_settings={"ignore_unknown_options": False})
@click.option("--model", "model", default=DEFAULT_MODEL, show_default=True,
              help="Model card name (glm5-nvfp4, tiny-cpu) or a card .toml file.")
@click.option("--model-path", default="", help="Checkpoint to serve instead of the card's.")
@click.option("--tp", type=int, default=None, help="--tp-size (default: the card's).")
@click.option("--ep", type=int, default=None, help="--ep-size (expert parallel).")
@click.option("--pp", type=int, default=None, help="--pp-size (pipeline parallel).")
@click.option("--dp", type=int, default=None, help="--dp-size (data parallel).")
@click.option("--enable-dp-attention", is_flag=True, help="DP attention (with --dp).")
@click.option("--attention-backend", default="", help="SGLang --attention-backend.")
@click.option("--dsa-prefill-backend", default="", help="DSA (formerly NSA) prefill backend.")
@click.option("--dsa-decode-backend", default="", help="DSA (formerly NSA) decode backend.")
@click.option("--fp8-gemm-backend", default="", help="SGLang --fp8-gemm-backend.")
@click.option("--fp4-gemm-backend", default="", help="SGLang --fp4-gemm-backend.")
@click.option("--moe-runner-backend", default="", help="SGLang --moe-runner-backend.")
@click.option("--kv-cache-dtype", default="", help="--kv-cache-dtype (default: the card's).")
@click.option("--disable-cuda-graph", is_flag=True, help="CUDA graphs off (decode and prefill).")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE",
              help="Environment for the server (NCCL_*, SGLANG_*); repeatable, recorded.")
@click.option("--inject", default="", help="Reference server only: 'nan-after N', 'hang', "
                                           "'crash-on-start'.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the server binds.")
@click.option("--port", type=int, default=None, help="Server port (default: first free from 30000).")
@click.option("--nnodes", type=int, default=1, show_default=True,
              help="Nodes of a multi-node launch: run serve-bench on every node with its "
                   "--node-rank and the same --dist-init-addr; node 0 serves and benchmarks.")
@click.option("--node-rank", type=int, default=0, show_default=True, help="This node's rank.")
@click.option("--dist-init-addr", default="", help="HOST:PORT of node 0 (multi-node).")
@click.option("--url", default=None, help="Attach to a running server instead of launching.")
@click.option("--sweep", is_flag=True, help="Try the card's launch configs in order; benchmark "
                                            "the first that serves correct tokens.")
@click.option("--sweep-file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              default=None, help="TOML ([[sweep]] tables) or JSON list of launch configs.")
@click.option("--dry-run", is_flag=True, help="Print the exact command and environment; run nothing.")
@click.option("--api", type=click.Choice(["generate", "completions"]), default="generate",
              show_default=True, help="SGLang /generate or OpenAI /v1/completions.")
@click.option("--concurrency", default="1,4,16,64", show_default=True,
              help="Concurrency levels of the sweep (closed loop).")
@click.option("--request-rate", type=float, default=None,
              help="Open loop at this many requests/s (Poisson; inf = all at once) instead.")
@click.option("--num-requests", type=int, default=None,
              help="Measured requests per level (default: max(2 x concurrency, 16)).")
@click.option("--warmup", type=int, default=2, show_default=True, help="Uncounted warm-up requests.")
@click.option("--input-len", type=int, default=128, show_default=True, help="Prompt tokens.")
@click.option("--output-len", type=int, default=64, show_default=True,
              help="Output tokens per request (ignore_eos).")
@click.option("--seed", type=int, default=0, show_default=True, help="Prompt and arrival seed.")
@click.option("--decode-batches", default="1,2,4,8,16,32,64", show_default=True,
              help="Batch sizes of the fixed-batch decode curve ('none' to skip).")
@click.option("--decode-output-len", type=int, default=64, show_default=True,
              help="Tokens per request in the decode curve.")
@click.option("--no-profile", is_flag=True, help="Skip /start_profile trace capture.")
@click.option("--profile-steps", type=int, default=8, show_default=True,
              help="num_steps for /start_profile (per stage).")
@click.option("--trace-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the server writes traces (default: inside the bundle).")
@click.option("--no-attribute", is_flag=True, help="Do not run attribution on the traces.")
@click.option("--startup-timeout", type=float, default=None,
              help="Seconds to wait for /health_generate (default 1800, 180 for tiny-cpu).")
@click.option("--stall-timeout", type=float, default=None,
              help="Give up (hang) when the server log shows no new line but HTTP access lines "
                   "for this long (default: off; 30 s for tiny-cpu).")
@click.option("--probe-tokens", type=int, default=32, show_default=True,
              help="Tokens each correctness probe request must return.")
@click.option("--probe-timeout", type=float, default=None,
              help="Seconds for the probe (default 600, 20 for tiny-cpu).")
@click.option("--request-timeout", type=float, default=600.0, show_default=True,
              help="Per-request deadline (s).")
@click.option("--sglang-path", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Directory with an sglang package whose parser checks the flags.")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
@out_dir
@verbosity
def command(**kw: Any) -> None:
    """See the module docstring (shown as --help)."""
    card = load_card(kw["model"])
    tiny = card.sglang.is_reference
    if kw["inject"] and not tiny:
        raise BadInput("--inject is for the reference server (--model tiny-cpu)")
    port = kw["port"] if kw["port"] is not None else free_port(kw["host"] if kw["host"] not in
                                                               ("0.0.0.0", "::") else "127.0.0.1")
    base = LaunchConfig(
        name="given", tp=kw["tp"], ep=kw["ep"], pp=kw["pp"], dp=kw["dp"],
        dp_attention=kw["enable_dp_attention"], attention_backend=kw["attention_backend"],
        dsa_prefill_backend=kw["dsa_prefill_backend"], dsa_decode_backend=kw["dsa_decode_backend"],
        fp8_gemm_backend=kw["fp8_gemm_backend"], fp4_gemm_backend=kw["fp4_gemm_backend"],
        moe_runner_backend=kw["moe_runner_backend"], kv_cache_dtype=kw["kv_cache_dtype"],
        cuda_graph=not kw["disable_cuda_graph"], extra_args=tuple(kw["server_args"]),
        env=_env(kw["env"]), inject=kw["inject"], model_path=kw["model_path"], host=kw["host"],
        port=port, nnodes=kw["nnodes"], node_rank=kw["node_rank"],
        dist_init_addr=kw["dist_init_addr"])
    if not (tiny or kw["dry_run"] or kw["url"]) and importlib.util.find_spec("sglang") is None:
        raise EnvironmentMissing("sglang is not installed in this Python, so it cannot be launched",
                                 hint="install sglang on the GPU box, use --dry-run to see the "
                                      "command, --url to attach, or --model tiny-cpu")
    parser = None
    if not tiny and not kw["url"]:
        # SGLang's own parser checks (and translates) every flag before anything is started.
        parser = load_parser(str(kw["sglang_path"]) if kw["sglang_path"] else None)
    if kw["dry_run"]:
        _dry_run(card, base, kw, parser)
        return
    out = kw["out"] or default_out_dir("serve-bench")
    bundle = Bundle.create(out, command="serve-bench", source=source_of(card.sglang.backend),
                           backend=card.sglang.backend, force=kw["force"])
    bundle.set_versions(sglang=parser.version if parser else None, **_versions())
    opts = _options(card, base, kw, parser, tiny)
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        summary = run(bundle, opts)
        if summary is not None and summary.profile and not kw["no_attribute"]:
            _attribute(bundle, summary)
    except KeyboardInterrupt:
        bundle.interrupted("interrupted")
        raise
    except PcieprofError as exc:
        bundle.interrupted(exc.message)
        progress.info(f"partial bundle: {bundle.path}")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    status = bundle.finish()
    if summary is not None and summary.runs:
        click.echo(format_table(summary.runs))
    rows = [r for r in summary.decode_curve if r.status == "ok"] if summary is not None else []
    if rows:
        click.echo("decode step (ms) by batch: " + ", ".join(
            f"{r.batch_size}: {r.step_time_ms:.2f}" for r in rows))
    prof = summary.profile if summary is not None else None
    if prof:
        click.echo(f"traces: {len(prof['files'])} file(s), ranks {prof['ranks']} ({prof['status']})")
    click.echo(f"bundle ({status}): {bundle.path}")
    click.echo(f"report: pcieprof report {bundle.path}")


def _sigterm(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _attribute(bundle: Bundle, summary: ServeSummary) -> None:
    """Attribute the captured decode traces into the bundle and note it in summary.json; a
    failure is recorded (part `attribution` failed), never raised, so the measured serving
    data is kept whatever the analysis makes of the traces."""
    profile = summary.profile or {}
    files = [bundle.path / f for f in profile.get("files") or []]
    if not files:
        return
    try:
        doc = attribute_traces(decode_traces(files), bundle)
        profile["attribution"] = {"status": "ok", "keys": sorted(doc)[:12]}
    except PcieprofError as exc:
        bundle.set_part("attribution", "failed", why=exc.one_line())
        profile["attribution"] = {"status": "failed", "why": exc.one_line()}
    except Exception as exc:  # noqa: BLE001 (attribution must not lose the measured serve data)
        why = f"{type(exc).__name__}: {exc}"[:300]
        bundle.set_part("attribution", "failed", why=why)
        profile["attribution"] = {"status": "failed", "why": why}
    summary.profile = profile
    bundle.write_doc(summary)


def _versions() -> dict[str, str | None]:
    try:
        import torch  # heavy: torch (seconds to import)

        return {"torch": torch.__version__}
    except ImportError:
        return {"torch": None}


def _options(card: ModelCard, base: LaunchConfig, kw: dict[str, Any], parser: ParserSpec | None,
             tiny: bool) -> BenchOptions:
    vocab = card.vocab_size if tiny else min(card.vocab_size, 32000)
    return BenchOptions(
        card=card, base=base, sweep=kw["sweep"] or kw["sweep_file"] is not None,
        sweep_file=kw["sweep_file"], url=kw["url"], api=kw["api"],
        concurrencies=_ints(kw["concurrency"], "--concurrency") or (1,),
        request_rate=kw["request_rate"], num_requests=kw["num_requests"], warmup=kw["warmup"],
        input_len=kw["input_len"], output_len=kw["output_len"], seed=kw["seed"],
        decode_batches=_ints(kw["decode_batches"], "--decode-batches"),
        decode_output_len=kw["decode_output_len"], profile=not kw["no_profile"],
        profile_steps=kw["profile_steps"], trace_dir=kw["trace_dir"],
        startup_timeout_s=kw["startup_timeout"] or (180.0 if tiny else 1800.0),
        stall_s=kw["stall_timeout"] or (30.0 if tiny else None), probe_tokens=kw["probe_tokens"],
        probe_timeout_s=kw["probe_timeout"] or (20.0 if tiny else 600.0),
        request_timeout_s=kw["request_timeout"], parser=parser,
        # Prompt token ids: the tiny model's whole vocabulary; for real models a range of ids
        # every tokenizer of that size has (prompts are random ids either way).
        vocab_high=vocab)


def _dry_run(card: ModelCard, base: LaunchConfig, kw: dict[str, Any],
             parser: ParserSpec | None) -> None:
    configs = entries_from(card, base, kw["sweep_file"]) if (kw["sweep"] or kw["sweep_file"]) \
        else None
    items = [(e.config, e.why) for e in configs] if configs else [(base, "")]
    for i, (cfg, why) in enumerate(items):
        cmd = build_command(card, cfg, parser=parser)
        if len(items) > 1:
            click.echo(f"# attempt {i}: {cfg.name}" + (f" - {why}" if why else ""))
        checked = (f"checked against SGLang {cmd.checked_against}'s own parser"
                   if cmd.checked_against else "")
        click.echo(f"# {'reference server' if cmd.reference else 'SGLang'} command"
                   + (f" ({checked})" if checked else ""))
        for note in cmd.notes:
            click.echo(f"# {note}")
        click.echo("# environment set for the server:")
        for k, v in sorted(cmd.env.items()):
            click.echo(f"export {k}={_q(v)}")
        inherited = {k: v for k, v in recorded_env(cmd).items() if k not in cmd.env}
        for k, v in inherited.items():
            click.echo(f"# inherited: {k}={v}")
        click.echo(" ".join(_q(a) for a in cmd.argv))
        click.echo("# argv: " + json.dumps(cmd.argv))
        if i + 1 < len(items):
            click.echo("")


def _q(s: str) -> str:
    return shlex.quote(s)


__all__ = ["command"]
