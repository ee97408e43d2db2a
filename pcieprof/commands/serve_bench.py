"""Launch (or --url attach to) SGLang or the reference server, load it, profile decode.

Server flags come from the model card, the options below and anything after `--`, e.g.
`pcieprof serve-bench --model glm5-nvfp4 --tp 8 -- --mem-fraction-static 0.9`; they are checked
against SGLang's own parser. `--launch-prefix 'docker run --gpus all --network host IMAGE'`
(or `srun ...`, `ssh HOST {cmd}`) starts SGLang where it is installed. `--sweep` searches the
launch choices (attention, DSA, GEMM, MoE, KV dtype, CUDA graphs) from what each failed launch
shows, until one serves correct tokens; `--dry-run --sweep` prints the search order with the
reason and source of each step; `--resume` continues an interrupted search. Results: a bundle
with serve/ (attempts.jsonl, search.json, server-N.log, requests.jsonl, summary.json,
decode_curve.csv, traces/).

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

import signal
import subprocess
from pathlib import Path
from typing import Any

import click

from pcieprof import progress
from pcieprof.analysis.attribution import attribute_traces
from pcieprof.analysis.box import Box
from pcieprof.bundle import Bundle, default_out_dir, outdir
from pcieprof.bundle.serve_search import ServeSearch
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.bundle.served_card import ServedCard
from pcieprof.cards import DEFAULT_CARD, LaunchTarget, ModelCard, load_card
from pcieprof.commands.launch_arch import launch_arch, launch_target, local_box
from pcieprof.commands.launch_plan import SearchPlan
from pcieprof.commands.options import out_dir, verbosity
from pcieprof.commands.serve_checks import (check_gpu_count, check_modes, check_sweep_gpu_count,
                                            check_values, env_pairs, ints)
from pcieprof.commands.serve_dry_run import print_commands, print_search
from pcieprof.commands.tuning import the_launch
from pcieprof.errors import BadInput, EnvironmentMissing, PcieprofError
from pcieprof.schema import source_of
from pcieprof.serve.launcher import free_port
from pcieprof.serve.metrics import format_table
from pcieprof.serve.run import BenchOptions, decode_traces, run
from pcieprof.serve.served import record
from pcieprof.serve.sglang_cmd import (LaunchConfig, LaunchPrefix, ParserSpec, load_parser,
                                       load_parser_in)
from pcieprof.serve.sweep import entries_from
from pcieprof.tune.search import Search
from pcieprof.tune.space import FLAGS, SearchSpace


@click.command("serve-bench", help=__doc__, context_settings={"ignore_unknown_options": False})
@click.option("--model", "model", default=DEFAULT_CARD, show_default=True,
              help="Model card: a shipped card's name (glm5-nvfp4, tiny-cpu), a .toml card, a "
                   "config.json (or its checkpoint directory) or a Hugging Face repository id in the "
                   "local cache.")
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
                                           "'crash-on-start', 'unsupported-arch', "
                                           "'hang-in-capture' (and, after --, "
                                           "--inject-matrix FILE).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the server binds.")
@click.option("--port", type=int, default=None,
              help="Server port (default: 30000, SGLang's; a launch here takes the first free "
                   "one from it).")
@click.option("--nnodes", type=int, default=1, show_default=True,
              help="Nodes of a multi-node launch: run serve-bench on every node with its "
                   "--node-rank and the same --dist-init-addr; node 0 serves and benchmarks.")
@click.option("--node-rank", type=int, default=0, show_default=True, help="This node's rank.")
@click.option("--dist-init-addr", default="", help="HOST:PORT of node 0 (multi-node).")
@click.option("--url", default=None, help="Attach to a running server instead of launching.")
@click.option("--sweep", is_flag=True,
              help="Launch search: try configurations chosen from the card's knowledge and from "
                   "how each earlier launch ended, until one serves correct tokens; benchmark "
                   "it. Backend options given start the search.")
@click.option("--resume", is_flag=True,
              help="Continue the launch search recorded in the --out bundle (after Ctrl-C).")
@click.option("--arch", default=None,
              help="GPU architecture the launch is for (sm120, sm100; default: this machine's "
                   "GPUs as NVML names them, else the card's).")
@click.option("--max-attempts", type=int, default=16, show_default=True,
              help="Launch attempts after which the search stops.")
@click.option("--sweep-file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              default=None, help="TOML ([[sweep]] tables) or JSON list of launch configs, tried "
                                 "in order instead of the search.")
@click.option("--launch-prefix", default="",
              help="Start the server through this: 'docker run --rm --gpus all --network host "
                   "IMAGE', 'srun -N1 --gres=gpu:8', 'ssh HOST {cmd}' ({cmd}: where the quoted "
                   "server command goes). SGLang's parser check runs through it too.")
@click.option("--dry-run", is_flag=True, help="Print the exact command and environment (with "
                                              "--sweep: the search order); run nothing.")
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
              help="Seconds to wait for /health_generate (default: the card's; 1800 glm5-nvfp4, "
                   "180 tiny-cpu).")
@click.option("--stall-timeout", type=float, default=None,
              help="Give up (hang) when the server log shows no start-up progress (weight "
                   "loading, CUDA-graph capture, warm-up) for this long; health checks do not "
                   "count (default: the card's; 300 glm5-nvfp4, 30 tiny-cpu; 0 = off).")
@click.option("--probe-tokens", type=int, default=32, show_default=True,
              help="Tokens each correctness probe request must return.")
@click.option("--probe-timeout", type=float, default=None,
              help="Seconds for the correctness probe (default: the card's; 300 glm5-nvfp4, 20 "
                   "tiny-cpu).")
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
    check_values(card, kw)
    port = _port(kw)
    base = LaunchConfig(
        name="given", tp=kw["tp"], ep=kw["ep"], pp=kw["pp"], dp=kw["dp"],
        dp_attention=kw["enable_dp_attention"], attention_backend=kw["attention_backend"],
        dsa_prefill_backend=kw["dsa_prefill_backend"], dsa_decode_backend=kw["dsa_decode_backend"],
        fp8_gemm_backend=kw["fp8_gemm_backend"], fp4_gemm_backend=kw["fp4_gemm_backend"],
        moe_runner_backend=kw["moe_runner_backend"], kv_cache_dtype=kw["kv_cache_dtype"],
        cuda_graph=not kw["disable_cuda_graph"], extra_args=tuple(kw["server_args"]),
        env=env_pairs(kw["env"]), inject=kw["inject"], model_path=kw["model_path"], host=kw["host"],
        port=port, nnodes=kw["nnodes"], node_rank=kw["node_rank"],
        dist_init_addr=kw["dist_init_addr"])
    check_modes(kw)
    prefix = LaunchPrefix.parse(kw["launch_prefix"])
    seen = None if tiny or kw["url"] else local_box()  # this machine's GPUs, asked once
    fits = None if seen is None or kw["sweep_file"] else check_gpu_count(
        card, base, seen, elsewhere=prefix is not None, dry_run=kw["dry_run"])
    sized = [] if seen is None or not kw["sweep_file"] else check_sweep_gpu_count(
        card, entries_from(base, kw["sweep_file"]), seen, elsewhere=prefix is not None,
        dry_run=kw["dry_run"], source=kw["sweep_file"])
    if not (tiny or kw["dry_run"] or kw["url"] or prefix) and not _sglang_runs_here():
        raise EnvironmentMissing("sglang is not installed for python3 on this machine, so it "
                                 "cannot be launched here",
                                 hint="--launch-prefix 'docker run --gpus all --network host "
                                      "IMAGE' (or srun/ssh) starts it where it is; --dry-run "
                                      "shows the command, --url attaches, --model tiny-cpu")
    parser, notes = _parser(kw, prefix, tiny)
    for count in [fits] if fits else sized:
        notes = [*notes, count]
        if not kw["dry_run"]:
            progress.info(count)
    box, where = None, None
    if card.search and (kw["sweep"] or not (kw["sweep_file"] or kw["url"])):
        where = launch_arch(card, kw["arch"], _resumed(kw), seen)
        kw, box, notes = {**kw, "arch": where.arch}, where.box, [*notes, where.line]
        if not kw["dry_run"]:
            progress.info(where.line)
    target = None
    if not (tiny or kw["url"]):  # the card's box settings are checked against this box
        target, fabric = launch_target(card, where, seen)
        notes = [*notes, fabric]
        if not kw["dry_run"]:
            progress.info(fabric)
    search = _search(card, kw, parser) if kw["sweep"] else None
    if not (kw["sweep"] or kw["sweep_file"] or kw["url"]):
        base, said = _the_launch(card, base, kw, box)
        notes = [*notes, *said]
    if kw["dry_run"]:
        if search is not None:
            print_search(card, base, search, parser, prefix, notes, target)
        else:
            print_commands(card, base, kw["sweep_file"], parser, prefix, notes, target)
        return
    out = kw["out"] or default_out_dir("serve-bench")
    if kw["resume"]:
        bundle = Bundle.open(out)
        outdir.lock(Path(out))  # one writer at a time, as for a new bundle
        if bundle.manifest.command != "serve-bench" or \
                getattr(bundle.read_doc(ServedCard), "name", None) != card.name:
            raise BadInput(f"{out} is not a serve-bench bundle of {card.name} to resume",
                           hint="--resume takes the --out of an interrupted serve-bench --sweep")
    else:
        read = (kw["model"], kw["sweep_file"], kw.get("model_path"))  # a card file, ...
        bundle = Bundle.create(out, command="serve-bench", source=source_of(card.sglang.backend),
                               backend=card.sglang.backend, force=kw["force"],
                               inputs=[p for p in read if p and Path(p).exists()])
    bundle.set_model(card)
    bundle.set_versions(sglang=parser.version if parser else None, **_versions())
    opts = _options(card, base, kw, parser, prefix, search, target)
    # SIGTERM and SIGHUP (the terminal closed) end the run as Ctrl-C does: servers stopped,
    # the bundle closed as partial.
    previous = {sig: signal.signal(sig, _sigterm) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        summary = run(bundle, opts)
        if summary is not None and summary.profile and not kw["no_attribute"]:
            _attribute(bundle, summary)
    except KeyboardInterrupt:
        bundle.interrupted("interrupted")  # the CLI names the partial bundle (pcieprof.cli)
        raise
    except PcieprofError as exc:
        bundle.interrupted(exc.message)
        progress.info(f"partial bundle: {bundle.path}")
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
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
    found = bundle.read_doc(ServeSearch)
    if found is not None and found.winner is not None:
        record(found.card, found.arch, bundle.path)
        click.echo(f"healthy configuration (attempt {found.winner.index}): "
                   f"{found.winner.command}")
        click.echo(f"its SGLang command per layout: pcieprof recommend TOPOLOGY_BUNDLE "
                   f"--serve {bundle.path}")
    click.echo(f"bundle ({status}): {bundle.path}")
    click.echo(f"report: pcieprof report {bundle.path}")


def _port(kw: dict[str, Any]) -> int:
    """--port, else SGLang's default (LaunchConfig.port, as recommend and the report print it);
    a launch here whose default port is taken uses the first free one after it, and says so (a
    dry run launches nothing, so it prints the default)."""
    if kw["port"] is not None:
        return int(kw["port"])
    default = LaunchConfig.port
    if kw["dry_run"] or kw["url"]:
        return default
    port = free_port(kw["host"] if kw["host"] not in ("0.0.0.0", "::") else "127.0.0.1",
                     start=default)
    if port != default:
        progress.info(f"port {default} (SGLang's default) is taken here: --port {port}")
    return port


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
        profile["attribution"] = {"status": "ok", "keys": sorted(doc.to_json())[:12]}
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


def _sglang_runs_here() -> bool:
    """Whether `python3` here (what the command runs) can import sglang; bounded to 60 s."""
    try:
        r = subprocess.run(["python3", "-c", "import importlib.util, sys; "
                            "sys.exit(importlib.util.find_spec('sglang') is None)"],
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _parser(kw: dict[str, Any], prefix: LaunchPrefix | None,
            tiny: bool) -> tuple[ParserSpec | None, list[str]]:
    """SGLang's own parser, to check (and translate) every flag before anything starts: read
    through the launch prefix when there is one (not in a dry run), else here.

    Returns:
        (the parser or None, lines saying where it came from or why there is none).
    """
    if tiny or kw["url"]:
        return None, []
    path = str(kw["sglang_path"]) if kw["sglang_path"] else None
    if prefix and not kw["dry_run"] and not path:
        spec, why = load_parser_in(prefix)
        if spec is not None:
            return spec, [f"flags checked against SGLang {spec.version}'s parser inside the "
                          f"launch prefix"]
        local = load_parser(None)
        note = (f"SGLang's parser check inside the launch prefix skipped: {why}; " +
                (f"checked against the local SGLang {local.version} parser instead" if local
                 else "flags not checked"))
        progress.warn(note)
        return local, [note]
    spec = load_parser(path)
    notes: list[str] = []
    if prefix:
        notes.append("--dry-run does not run the launch prefix: " +
                     (f"flags checked against the local SGLang {spec.version} parser" if spec
                      else "flags not checked (no SGLang parser here)"))
    return spec, notes


def _given_axes(kw: dict[str, Any]) -> dict[str, str]:
    """The launch-search axes given as options (--attention-backend, ..., --disable-cuda-graph)."""
    start = {axis: kw[axis] for axis in FLAGS if axis in kw and kw[axis]}
    if kw["disable_cuda_graph"]:
        start["cuda_graph"] = "off"
    return start


def _resumed(kw: dict[str, Any]) -> ServeSearch | None:
    """The launch search --resume continues, when its bundle reads (else opening it later says
    what is wrong)."""
    if not (kw["resume"] and kw["out"]):
        return None
    try:
        return Bundle.open(kw["out"]).read_doc(ServeSearch)
    except PcieprofError:
        return None


def _the_launch(card: ModelCard, base: LaunchConfig, kw: dict[str, Any],
                box: Box | None) -> tuple[LaunchConfig, list[str]]:
    """Without --sweep: the launch configuration recommend prints (pcieprof.commands.tuning.
    the_launch: served last here, else the search's first-ranked; options given start it), and
    the lines saying where it comes from. `box`: this machine's GPUs when they decided the
    architecture (one the card has no launch evidence for gets no architecture-specific
    backends)."""
    if not card.search:
        return base, []
    choice = the_launch(card, kw["arch"] if box is None else None, given=_given_axes(kw),
                        box=box)
    for caveat in choice.caveats:  # a value the card marks failing, named by the user
        progress.warn(caveat)
    lines = [f"launch backends: {choice.describe()} ({choice.label})", *choice.caveats]
    return base.with_axes(choice.config, base.name), lines


def _search(card: ModelCard, kw: dict[str, Any], parser: ParserSpec | None) -> Search:
    """The launch search over the card's space, started from the backends given."""
    choices = parser.choices([f for f in FLAGS.values() if f]) if parser else None
    space = SearchSpace.from_card(card.name, card.search, arch=kw["arch"], choices=choices,
                                  version=parser.version if parser else "",
                                  load_other=lambda name: load_card(name).search)
    return Search(space, start=_given_axes(kw), max_attempts=kw["max_attempts"])


def _options(card: ModelCard, base: LaunchConfig, kw: dict[str, Any], parser: ParserSpec | None,
             prefix: LaunchPrefix | None, search: Search | None,
             target: LaunchTarget | None) -> BenchOptions:
    tiny = card.sglang.is_reference
    facts = card.sglang
    vocab = card.vocab_size if tiny else min(card.vocab_size, 32000)
    stall = kw["stall_timeout"] if kw["stall_timeout"] is not None else facts.stall_timeout_s
    return BenchOptions(
        card=card, base=base,
        plan=SearchPlan(search, base, sources=card.sources,
                        sglang=parser.version if parser else None) if search else None,
        resume=kw["resume"], sweep_file=kw["sweep_file"],
        prefix=prefix, fresh_port=kw["port"] is None, url=kw["url"], api=kw["api"],
        concurrencies=ints(kw["concurrency"], "--concurrency") or (1,),
        request_rate=kw["request_rate"], num_requests=kw["num_requests"], warmup=kw["warmup"],
        input_len=kw["input_len"], output_len=kw["output_len"], seed=kw["seed"],
        decode_batches=ints(kw["decode_batches"], "--decode-batches"),
        decode_output_len=kw["decode_output_len"], profile=not kw["no_profile"],
        profile_steps=kw["profile_steps"], trace_dir=kw["trace_dir"],
        startup_timeout_s=kw["startup_timeout"] or facts.startup_timeout_s,
        stall_s=stall or None, probe_tokens=kw["probe_tokens"],
        probe_timeout_s=kw["probe_timeout"] or facts.probe_timeout_s,
        request_timeout_s=kw["request_timeout"], parser=parser, target=target,
        # Prompt token ids: the tiny model's whole vocabulary; for real models a range of ids
        # every tokenizer of that size has (prompts are random ids either way).
        vocab_high=vocab)


__all__ = ["command"]
