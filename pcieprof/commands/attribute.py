"""`pcieprof attribute [TRACE...] [--model CARD --topology BUNDLE]`: how much of each decode step
is communication, from traces and from the analytic model, side by side."""

from __future__ import annotations

import signal

from pathlib import Path
from typing import Any

import click

from pcieprof import progress
from pcieprof.analysis.attribution import _table, attribute_traces
from pcieprof.analysis.comm_model import Layout, Pricer, comparison_table, predict_step_comm
from pcieprof.bundle import Bundle, default_out_dir
from pcieprof.bundle.attribution import Attribution
from pcieprof.bundle.comm_model import CommModel, CommModelRow
from pcieprof.bundle.document import decode
from pcieprof.cards import load_card
from pcieprof.commands.options import out_dir, verbosity
from pcieprof.errors import BadInput


def _expand(traces: tuple[Path, ...]) -> list[Path]:
    """Files as given; a directory stands for the trace files in it."""
    out: list[Path] = []
    for t in traces:
        if t.is_dir():
            found = sorted(p for p in t.rglob("*") if p.is_file() and not p.name.startswith(".")
                           and p.name.endswith((".json", ".json.gz")) and "trace" in p.name.lower())
            if not found:
                found = sorted(p for p in t.iterdir() if p.is_file() and not p.name.startswith(".")
                               and p.name.endswith((".json", ".json.gz")))
            if not found:
                raise BadInput(f"{t}: no *.json / *.json.gz trace files in this directory")
            out += found
        else:
            out.append(t)
    return out


def _batches(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--batches {text!r}: give comma-separated integers, e.g. 1,2,4,8") from None
    if not out or min(out) < 1:
        raise BadInput(f"--batches {text!r}: batch sizes must be >= 1")
    return out


@click.command("attribute")
@click.argument("traces", nargs=-1, type=click.Path(path_type=Path))
@click.option("--classes", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="TOML table of extra kernel-name rules, tried before the built-in ones "
                   "(same shape as pcieprof/analysis/kernel_classes.toml).")
@click.option("--drop-last-step", is_flag=True,
              help="Count only events launched before the last ProfilerStep (what HTA does).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes (default: one per trace file, at most the CPU count; one for "
                   "less than 8 MB of files).")
@click.option("--model", "model", default=None,
              help="Model card for the analytic comm model: a shipped card (glm5-nvfp4), a .toml "
                   "card, a config.json (or its checkpoint directory) or a Hugging Face repository id "
                   "in the local cache.")
@click.option("--topology", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Topology bundle whose allreduce.csv prices the model's collectives.")
@click.option("--serve", "serve_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="serve-bench bundle with serve/decode_curve.csv (measured decode steps) and, "
                   "without TRACES, its attribution.json (traced communication).")
@click.option("--tp", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--dp-attention", is_flag=True, help="SGLang --enable-dp-attention (dp = tp).")
@click.option("--deepep", is_flag=True, help="EP with DeepEP all-to-all dispatch/combine.")
@click.option("--mtp", is_flag=True, help="MTP speculative decoding (3 steps, 4 draft tokens).")
@click.option("--variant", default="default", show_default=True,
              help="allreduce.csv variant to price with.")
@click.option("--batches", default="1,2,4,8,16,32,64", show_default=True)
@out_dir
@verbosity
def command(traces: tuple[Path, ...], classes: Path | None, drop_last_step: bool,
            workers: int | None, model: str | None, topology: Path | None, serve_dir: Path | None,
            tp: int, ep: int, pp: int, dp_attention: bool, deepep: bool, mtp: bool, variant: str,
            batches: str, out: Path | None, force: bool) -> None:
    """Attribute decode time to communication, memory and compute.

    From traces: TRACE is a PyTorch-profiler trace (plain or .gz; one per rank, e.g. SGLang's
    ...-TP-<r>...trace.json.gz), or a directory holding them. Per rank and per decode step:
    union time of each class (all streams merged), communication overlapped by compute,
    exposed communication (no compute running), idle. Across ranks: the minimum duration of each
    collective over ranks is transfer, the rest is waiting for slower ranks (skew).
    Writes attribution.json and attribution/*.csv.

    From the model (--model and --topology): the collectives one decode step of the layout
    needs, priced with the bundle's all-reduce curve, per batch size, next to the measured step
    (--serve) and the traces' comm time. Writes comm_model.json and attribution/comm_model.csv.
    """
    if not traces and not model:
        raise BadInput("nothing to attribute", hint="give trace files, or --model and --topology")
    if bool(model) != bool(topology):
        raise BadInput("--model and --topology go together")
    paths = _expand(traces)
    # The bundles it reads are checked before one is written: a bad one is its own line.
    topo_b = Bundle.open(topology).check() if topology else None
    serve_b = Bundle.open(serve_dir).check() if serve_dir else None
    bundle = Bundle.create(out or default_out_dir("attribute"), command="attribute",
                           source="measured", backend="imported", force=force,
                           inputs=[*traces, *(p for p in (classes, topology, serve_dir) if p)])
    doc: Attribution | None = None
    # SIGTERM and SIGHUP end the run as Ctrl-C does: workers stopped, the bundle partial, one
    # line, exit 130 (a SIGKILL leaves no worker either: pcieprof.analysis.attribution)
    previous = {sig: signal.signal(sig, _as_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if paths:
            doc = attribute_traces(paths, bundle, classes, drop_last_step=drop_last_step,
                                   workers=workers)
            bundle.manifest.backend = getattr(bundle.part("attribution"), "backend", None) or "imported"
        rows = None
        if model and topo_b:
            rows = _model_table(bundle, model, topo_b, serve_b, doc, tp, ep, pp, dp_attention,
                                deepep, mtp, variant, _batches(batches))
    except KeyboardInterrupt:
        bundle.interrupted("interrupted")  # the CLI names the partial bundle (pcieprof.cli)
        raise
    except BaseException as exc:
        bundle.interrupted(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    bundle.finish()
    if doc is not None:
        _summary(doc)
    if rows:
        _model_summary(rows)
    progress.info(f"bundle: {bundle.path}  (report: pcieprof report {bundle.path})")
    click.echo(f"wrote {bundle.path}")


def _as_interrupt(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _model_table(bundle: Bundle, model: str, topology: Bundle, serve: Bundle | None,
                 doc: Attribution | None, tp: int, ep: int, pp: int, dp_attention: bool,
                 deepep: bool, mtp: bool, variant: str, batches: list[int]) -> list[dict[str, Any]]:
    card = load_card(model)
    bundle.set_model(card)  # the card the model table is for
    layout = Layout(tp=tp, ep=ep, pp=pp, dp_attention=dp_attention,
                    moe_a2a="deepep" if deepep else "none", speculative=mtp)
    pricer = Pricer(topology, variant)
    bundle.set_part("comm_model", "running")
    # the traced side: these traces, else what serve-bench attributed in the --serve bundle
    attribution = (doc if doc is not None
                   else serve.read_doc(Attribution) if serve is not None else None)
    rows = comparison_table(card, layout, batches, pricer, serve, attribution)
    detail = predict_step_comm(card, layout, batches[0], pricer)
    bundle.write_doc(CommModel(topology=topology.path.name, table=[decode(CommModelRow, r, "comm_model row") for r in rows],
                               detail_batch=batches[0], detail=detail))
    bundle.write_text("attribution/comm_model.csv", _table(rows))
    bundle.set_part("comm_model", "ok", source=detail["source"], backend=detail["backend"])
    return rows


#: SGLang's ForwardMode names as the traces carry them, for people. sgl-project/sglang
#: python/sglang/srt/model_executor/forward_batch_info.py, class ForwardMode: EXTEND "Extend a
#: sequence ... It is also called 'prefill' in common terminology"; DECODE "Decode one token";
#: MIXED "Contains both EXTEND and DECODE when doing chunked prefill".
STEP_KINDS = {"EXTEND": "EXTEND (prefill: the prompt's tokens)",
              "DECODE": "DECODE (one new token per request)",
              "MIXED": "MIXED (prefill and decode in one step, chunked prefill)"}


def _step_kind(kind: str) -> str:
    """A step kind for people: SGLang's name with what it is."""
    return STEP_KINDS.get(kind, kind)


def _fmt(v: float | None, scale: float = 1e-3) -> str:
    return "-" if v is None else f"{v * scale:10.3f}"


def _summary(doc: Attribution) -> None:
    click.echo(f"timeline: {doc.timeline}   window: {doc.window}   "
               f"reader: {doc.parser['reader']}, {doc.parser['wall_s']:.2f} s")
    click.echo(f"{'rank':>4} {'span ms':>10} {'comm ms':>10} {'compute ms':>10} {'memory ms':>10} "
               f"{'exposed ms':>10} {'overlap %':>9} {'idle ms':>10} {'wait ms':>10} steps")
    for r in doc.ranks:
        t = r.totals
        ov = t["comm_overlap_pct"]
        click.echo(f"{r.rank:>4} {_fmt(t['span_us'])} {_fmt(t['comm_us'])} {_fmt(t['compute_us'])} "
                   f"{_fmt(t['memory_us'])} {_fmt(t['exposed_comm_us'])} "
                   f"{'-' if ov is None else f'{ov:9.2f}':>9} {_fmt(t['idle_us'])} "
                   f"{_fmt(r.skew.wait_us if r.skew else None)} {r.n_steps} ({r.steps_from})")
        if r.steps_note:
            click.echo(f"     rank {r.rank}: {r.steps_note}")
        d = r.decode_steps
        kinds = r.step_kinds
        shown = [("per step", d)] if d else [(f"per {_step_kind(k)} step", v)
                                             for k, v in kinds.items()]
        for label, v in shown:
            ms = {k: (v.get(f"mean_{k}_us") or 0.0) / 1e3
                  for k in ("span", "comm", "compute", "exposed_comm")}
            share = 100 * ms["comm"] / ms["span"] if ms["span"] else 0
            click.echo(f"     {label} (n={v['n']}): span {ms['span']:.3f} ms, comm "
                       f"{ms['comm']:.3f} ms ({share:.1f} %), compute {ms['compute']:.3f} ms, "
                       f"exposed {ms['exposed_comm']:.3f} ms")


def _model_summary(rows: list[dict[str, Any]]) -> None:
    r0 = rows[0]
    click.echo(f"\nanalytic model: {r0['model']} {r0['layout']}, priced with "
               f"{r0['priced_source']}/{r0['priced_backend']} all-reduce curve ({r0['variant']})")
    click.echo(f"{'batch':>5} {'collectives':>11} {'step ms':>9} {'pred comm ms':>12} {'comm %':>7} "
               f"{'trace comm ms':>13} {'exposed ms':>10} {'disagree %':>10}")
    f = lambda v, w, p=3: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
    for r in rows:
        click.echo(f"{r['batch']:>5} {r['n_collectives']:>11} {f(r['measured_step_ms'], 9)} "
                   f"{f(r['predicted_comm_ms'], 12)} {f(r['predicted_comm_share_pct'], 7, 1)} "
                   f"{f(r['trace_comm_ms'], 13)} {f(r['exposed_comm_ms'], 10)} "
                   f"{f(r['disagreement_pct'], 10, 1)}")
    if r0["notes"]:
        click.echo(f"notes: {r0['notes']}")
