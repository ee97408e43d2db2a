"""`pcieprof demo`: the embedded default, the whole pipeline without a GPU.

It runs the same commands a user would type, in order, and prints each one, so the demo is also
the tutorial:

1. `pcieprof topology --backend sim` on the VM profile (and on its bare-metal twin as the baseline):
   a simulated bundle, every number labelled `simulated`.
2. `pcieprof recommend` on the VM bundle: ring order, NCCL settings and the model's layouts.
3. `pcieprof serve-bench --model tiny-cpu`: the reference server on this machine's CPUs (real
   processes, real gloo all-reduces, real traces), load, decode curve, profiling and attribution;
   labelled `measured, backend cpu`.
4. `pcieprof report` of all bundles side by side: one offline HTML page (it first saves
   `recommend`'s result into the baseline bundle, which has none: the page draws what is saved).
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import click

from pcieprof import progress
from pcieprof.bundle import default_out_dir, prepare_out_dir
from pcieprof.cards import DEFAULT_CARD
from pcieprof.commands import recommend, report, serve_bench, topology
from pcieprof.commands.options import out_dir, verbosity
from pcieprof.sim.fabric import DEFAULT_PROFILE


def _run(cmd: click.Command, args: list[str]) -> None:
    """Run one pcieprof subcommand in this process, as if typed."""
    click.echo(f"\n$ pcieprof {cmd.name} {shlex.join(args)}")
    cmd.main(args=args, prog_name=f"pcieprof {cmd.name}", standalone_mode=False)


@click.command("demo")
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              help="Fabric profile of the simulated box.")
@click.option("--baseline", default="rtxpro6000-8x-switch", show_default=True,
              help="Second profile shown side by side ('none' to skip).")
@click.option("--model", default=DEFAULT_CARD, show_default=True,
              help="Model card the tuner advises for.")
@click.option("--tp", default=2, show_default=True, type=click.IntRange(1, 8),
              help="Tensor-parallel ranks of the reference server (CPU processes).")
@click.option("--no-serve", is_flag=True, help="Skip the reference-server benchmark.")
@out_dir
@verbosity
def command(profile: str, baseline: str, model: str, tp: int, no_serve: bool, out: Path | None,
            force: bool) -> None:
    """Run topology (simulated), recommend, serve-bench (reference server) and report.

    Needs no GPU: the box is the calibrated fabric model of PROFILE (numbers labelled simulated);
    the serving benchmark runs the pcieprof reference server on this machine's CPUs (labelled
    measured, backend cpu). Takes a few minutes on a laptop.
    """
    root = out or default_out_dir("demo")
    try:
        reuse = force and root.is_dir()  # --force: each step clears its own bundle
    except OSError:
        reuse = False
    if not reuse:
        prepare_out_dir(root, force=False)  # one line when it cannot be written
    try:
        _steps(root, profile, baseline, model, tp, no_serve, force)
    except (KeyboardInterrupt, click.exceptions.Abort):  # click turns Ctrl-C into Abort
        click.echo(f"pcieprof: interrupted; partial demo output: {root}", err=True)
        raise


def _steps(root: Path, profile: str, baseline: str, model: str, tp: int, no_serve: bool,
           force: bool) -> None:
    force_args = ["--force"] if force else []
    t0 = time.monotonic()

    box = root / f"topology-{profile.removesuffix('.toml').rsplit('/', 1)[-1]}"
    _run(topology.command, ["--backend", "sim", "--sim-profile", profile, "--no-report",
                            "--model", model, "--out", str(box), *force_args])
    bundles = [box]
    if baseline != "none":
        base = root / f"topology-{baseline.removesuffix('.toml').rsplit('/', 1)[-1]}"
        _run(topology.command, ["--backend", "sim", "--sim-profile", baseline, "--no-report",
                                "--model", model, "--out", str(base), *force_args])
        bundles.append(base)
    _run(recommend.command, [str(box), "--model", model])
    if not no_serve:
        serve = root / "serve-tiny-cpu"
        _run(serve_bench.command, ["--model", "tiny-cpu", "--tp", str(tp),
                                   "--concurrency", "1,4,8", "--num-requests", "8",
                                   "--output-len", "32", "--decode-batches", "1,2,4,8",
                                   "--out", str(serve), *force_args])
        bundles.append(serve)
    html = root / "report.html"
    _run(report.command, [*map(str, bundles), "-o", str(html), "--model", model])
    progress.info(f"demo finished in {time.monotonic() - t0:.0f} s")
    click.echo(f"\ndemo report: {html}")
    click.echo("numbers of the topology bundles are simulated (fabric model); the serving "
               "benchmark is measured on this machine's CPUs (reference server, not a GPU).")
    for line in next_steps(html):
        click.echo(line)


def next_steps(html: Path) -> list[str]:
    """The demo's last lines: what to do next, here and on a GPU box."""
    return ["",
            "next:",
            f"  open {html.resolve().as_uri()} in a browser (one offline page)",
            "  on a GPU box: pcieprof topology            # measures its fabric: a bundle "
            "and its report.html",
            "                pcieprof recommend BUNDLE    # the settings for that box",
            "  have logs of another box? pcieprof import FILE... (nvidia-smi topo -m, NCCL "
            "logs, nccl-tests, p2pBandwidthLatencyTest)"]
