"""`pcieprof attribute TRACE...`: how much of each decode step is communication, from traces."""

from __future__ import annotations

from pathlib import Path

import click

from pcieprof import progress
from pcieprof.bundle import Bundle, default_out_dir
from pcieprof.commands.options import out_dir, verbosity


def _expand(traces: tuple[Path, ...]) -> list[Path]:
    """Files as given; a directory stands for the trace files in it."""
    out: list[Path] = []
    for t in traces:
        if t.is_dir():
            found = sorted(p for p in t.rglob("*") if p.is_file() and
                           (p.name.endswith((".json", ".json.gz")) and "trace" in p.name.lower()
                            or p.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))))
            if not found:
                found = sorted(p for p in t.iterdir() if p.name.endswith((".json", ".json.gz")))
            out += found
        else:
            out.append(t)
    return out


@click.command("attribute")
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--classes", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="TOML table of extra kernel-name rules, tried before the built-in ones "
                   "(same shape as pcieprof/analysis/kernel_classes.toml).")
@click.option("--drop-last-step", is_flag=True,
              help="Count only events launched before the last ProfilerStep (what HTA does).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes (default: one per trace file, at most the CPU count).")
@out_dir
@verbosity
def command(traces: tuple[Path, ...], classes: Path | None, drop_last_step: bool,
            workers: int | None, out: Path | None, force: bool) -> None:
    """Attribute GPU time in per-rank Kineto traces to communication, memory and compute.

    TRACE is a PyTorch-profiler trace (plain or .gz; one per rank, e.g. SGLang's
    ...-TP-<r>...trace.json.gz), or a directory holding them. Per rank and per decode step:
    union time of each class (all streams merged), communication overlapped by compute,
    exposed communication (no compute running), idle. Across ranks: the minimum duration of each
    collective over ranks is transfer, the rest is waiting for slower ranks (skew).
    Writes attribution.json and attribution/*.csv.
    """
    from pcieprof.analysis.attribution import attribute_traces

    paths = _expand(traces)
    bundle = Bundle.create(out or default_out_dir("attribute"), command="attribute",
                           source="measured", backend="imported", force=force)
    try:
        doc = attribute_traces(paths, bundle, classes, drop_last_step=drop_last_step,
                               workers=workers)
    except BaseException as exc:
        bundle.interrupted(f"{type(exc).__name__}: {exc}")
        raise
    bundle.manifest["backend"] = bundle.part("attribution").get("backend", "imported")
    bundle.finish()
    _summary(doc, bundle)


def _fmt(v: float | None, scale: float = 1e-3) -> str:
    return "-" if v is None else f"{v * scale:10.3f}"


def _summary(doc: dict, bundle: Bundle) -> None:
    click.echo(f"timeline: {doc['timeline']}   window: {doc['window']}   "
               f"parser: ijson/{doc['parser']['ijson_backend']}, {doc['parser']['wall_s']:.2f} s")
    click.echo(f"{'rank':>4} {'span ms':>10} {'comm ms':>10} {'compute ms':>10} {'memory ms':>10} "
               f"{'exposed ms':>10} {'overlap %':>9} {'idle ms':>10} {'wait ms':>10} steps")
    for r in doc["ranks"]:
        t = r["totals"]
        sk = r.get("skew") or {}
        ov = t["comm_overlap_pct"]
        click.echo(f"{r['rank']:>4} {_fmt(t['span_us'])} {_fmt(t['comm_us'])} {_fmt(t['compute_us'])} "
                   f"{_fmt(t['memory_us'])} {_fmt(t['exposed_comm_us'])} "
                   f"{'-' if ov is None else f'{ov:9.2f}':>9} {_fmt(t['idle_us'])} "
                   f"{_fmt(sk.get('wait_us'))} {r['n_steps']} ({r['steps_from']})")
        d = r.get("decode_steps")
        if d:
            share = 100 * d["mean_comm_us"] / d["mean_span_us"] if d["mean_span_us"] else 0
            click.echo(f"     per step (n={d['n']}): span {d['mean_span_us'] / 1e3:.3f} ms, comm "
                       f"{d['mean_comm_us'] / 1e3:.3f} ms ({share:.1f} %), exposed "
                       f"{d['mean_exposed_comm_us'] / 1e3:.3f} ms")
    progress.info(f"bundle: {bundle.path}  (report: pcieprof report {bundle.path})")
    click.echo(f"wrote {bundle.path / 'attribution.json'}")
