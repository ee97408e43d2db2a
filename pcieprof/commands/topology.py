"""`pcieprof topology`: discover this machine, probe P2P copies and all-reduce, write a bundle and
a report.

Backends: `cuda` (real GPUs, NCCL), `cpu` (gloo and host memory copies between local processes:
measures this machine and the harness), `sim` (the fabric model), `auto` (cuda when NVML and torch
see GPUs, else cpu, said in one line).
"""

from __future__ import annotations

import platform
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import click

from pcieprof import progress
from pcieprof.bundle import Bundle, default_out_dir
from pcieprof.commands.options import out_dir, verbosity
from pcieprof.errors import BadInput, EnvironmentMissing, ExitCode, PcieprofError
from pcieprof.schema import source_of

#: The cpu backend runs one process per rank on this machine; more than this is not a useful
#: picture of anything and would only thrash the cores.
MAX_CPU_RANKS = 16


def gpu_count() -> tuple[int, str]:
    """(GPUs that both NVML and torch see, why not when 0)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n_nvml = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return 0, f"NVML not usable ({type(exc).__name__})"
    try:
        import torch

        n_torch = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:
        return 0, f"torch.cuda not usable ({exc})"
    if n_torch == 0:
        return 0, f"NVML sees {n_nvml} GPU(s) but torch has no CUDA (a CPU build of torch?)"
    # device numbers are NVML indices; the runner sets CUDA_VISIBLE_DEVICES itself
    return n_nvml, ""


def resolve_backend(backend: str) -> str:
    """`auto` -> `cuda` or `cpu` (one line on stderr when it falls back)."""
    if backend != "auto":
        return backend
    n, why = gpu_count()
    if n:
        return "cuda"
    progress.info(f"no GPU usable ({why}): running the cpu backend")
    return "cpu"


def parse_devices(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        devs = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise BadInput(f"--devices {text!r} is not a comma-separated list of indices") from None
    if not devs:
        raise BadInput("--devices is empty")
    if len(set(devs)) != len(devs):
        raise BadInput(f"--devices {text!r} repeats a device")
    return devs


def parse_size(text: str | None) -> int | None:
    """`65536`, `64KiB`, `16MiB`, `1GiB` -> bytes; None stays None."""
    if text is None:
        return None
    t = text.strip()
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if t.endswith(unit):
            t, mult = t[: -len(unit)].strip(), k
            break
    else:
        mult = 1
    try:
        n = int(t) * mult
    except ValueError:
        raise BadInput(f"size {text!r} is not a number of bytes (e.g. 65536 or 64KiB)") from None
    if n < 8:
        raise BadInput(f"size {text!r}: needs at least 8 B")
    return n


def resolve_devices(backend: str, devices: list[int] | None, nranks: int | None,
                    available: int) -> list[int]:
    """The devices of the run.

    Args:
        backend: `cuda`, `cpu` or `sim`.
        devices: `--devices` (GPU indices), or None.
        nranks: `--nranks`, or None.
        available: GPUs there are (cuda: seen by NVML and torch; sim: in the profile), or the
            cpu rank limit.

    Raises:
        BadInput: unknown device index, --nranks < 1 or above what exists, both options given.
    """
    if devices is not None and nranks is not None:
        raise BadInput("give --devices or --nranks, not both")
    if nranks is not None:
        if nranks < 1:
            raise BadInput(f"--nranks {nranks}: needs at least 1")
        if nranks > available:
            what = "the cpu backend's limit" if backend == "cpu" else "GPUs here"
            raise BadInput(f"--nranks {nranks} is more than {what} ({available})")
        return list(range(nranks))
    if devices is not None:
        if backend == "cpu":
            raise BadInput("the cpu backend has no devices to pick", hint="use --nranks N")
        unknown = [d for d in devices if d < 0 or d >= available]
        if unknown:
            raise BadInput(f"unknown device index {unknown[0]}",
                           hint=f"this run has devices 0..{available - 1}")
        return devices
    return list(range(4 if backend == "cpu" else available))


def discover_into(bundle: Bundle, backend: str) -> dict[str, Any]:
    """Run discovery (pcieprof.discover) into topology.json and the manifest's versions."""
    bundle.set_part("discovery", "running")
    versions: dict[str, Any] = {}
    try:
        import torch

        versions["torch"] = torch.__version__
    except ImportError:
        pass
    from pcieprof.discover import versions as get_versions
    from pcieprof.discover.topology import discover

    status, why = "ok", None
    try:
        topo = discover()
    except PcieprofError:
        raise
    except Exception as exc:  # a discovery bug must not cost the measurements
        topo = {"source": "measured", "gpus": [], "pairs": [],
                "status": {"discovery": f"error: {type(exc).__name__}: {exc}"}}
        status, why = "partial", f"discovery failed: {exc}"
    try:
        versions.update({k: v for k, v in dict(get_versions()).items() if k not in versions})
    except Exception as exc:
        progress.warn(f"versions: {exc}")
    bundle.write_json("topology.json", topo)
    bundle.set_versions(**versions)
    bundle.set_part("discovery", status, why=why, gpus=len(topo.get("gpus") or []))
    return topo


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: kill the workers, mark the bundle partial."""


def _on_sigterm(_signo: int, _frame: FrameType | None) -> None:
    raise _Terminated()


@click.command("topology")
@click.option("--backend", type=click.Choice(["auto", "cuda", "cpu", "sim"]), default="auto",
              show_default=True, help="cuda: real GPUs and NCCL; cpu: gloo and host copies between "
              "local processes (measures this machine); sim: the fabric model.")
@click.option("--sim-profile", default=None, metavar="NAME|FILE.toml",
              help="Fabric profile for --backend sim (e.g. rtxpro6000-8x-vm).")
@click.option("--devices", default=None, metavar="0,1,..", help="GPU indices (nvidia-smi order).")
@click.option("--nranks", type=int, default=None, help="Number of ranks / GPUs (0..N-1).")
@click.option("--quick", is_flag=True, help="Short plan: all-reduce 8 B..64 MiB, 3 variants.")
@click.option("--variants", default=None, metavar="a,b|all",
              help="All-reduce variants: default, p2p_disable, p2p_level_sys, proto_ll, "
              "proto_simple, algo_ring, algo_tree, nch2, nch8, or all.")
@click.option("--groups", default=None, metavar="pairs,tp4",
              help="Also run the default variant over sub-groups: every pair, the TP4 groups "
              "(default: both without --quick, none with it).")
@click.option("--ring-order", "orders", multiple=True, metavar="0,2,1,3",
              help="Also run the default variant over this GPU order (repeatable).")
@click.option("--p2p-sweep", is_flag=True, help="Add a P2P bandwidth size sweep per pair.")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True,
              help="Deadline of each copy / collective, seconds; past it the launch is killed "
              "and recorded as status=hang.")
@click.option("--max-size", default=None, metavar="BYTES|64KiB",
              help="Cap on every copy and all-reduce message size (a short run).")
@click.option("--nnodes", default="1", show_default=True, help="torchrun --nnodes.")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT",
              help="torchrun rendezvous endpoint (several nodes).")
@click.option("--probes", "probe_set", default="copies,allreduce", show_default=True,
              metavar="copies,allreduce", help="Which probes to run: the copy probes (P2P matrix, "
              "h2d/d2h, concurrent traffic) and/or the all-reduce sweep.")
@click.option("--no-report", is_flag=True, help="Do not write report.html.")
@out_dir
@verbosity
def command(backend: str, sim_profile: str | None, devices: str | None, nranks: int | None,
            quick: bool, variants: str | None, groups: str | None, orders: tuple[str, ...],
            p2p_sweep: bool, timeout_s: float, max_size: str | None, nnodes: str, rdzv_endpoint: str | None,
            probe_set: str, no_report: bool, out: Path | None, force: bool) -> None:
    """Discover GPUs, PCIe tree, IOMMU/ACS/VM; probe P2P copies, concurrent traffic and the
    all-reduce sweep; write a bundle and report.html.

    p2p.csv: bandwidth in GB/s (1e9 B/s), latency in us, median of trials with min/max. On cuda
    each trial holds its streams with a spin kernel, then times `iters` copies between CUDA
    events (p2pBandwidthLatencyTest's method: host queueing time stays outside); the copied bytes
    are checked against a buffer first filled with their complement.

    allreduce.csv: nccl-tests formulas and timing: `iters` all-reduces back to back between one
    pair of CUDA events, median of 5 trials (min/max the extreme trials); algbw = bytes / time,
    busbw = algbw * 2(n-1)/n. Each case first runs untimed with NCCL's per-collective TUNING log
    (nccl/<variant>.tuning.log), then timed with NCCL's init log only (nccl/<variant>.log).
    --ring-order is applied through NCCL_GRAPH_FILE and checked against the rings NCCL logged.
    NCCL_* / TORCH_NCCL_* variables of your shell are not passed on (recorded in
    nccl_choices.json). Details: docs/probes.md.
    """
    from probes import variants as V
    from probes.plan import build_plan

    if not sys.platform.startswith("linux"):
        raise EnvironmentMissing(f"pcieprof topology needs Linux (this is {platform.system()})")
    if timeout_s <= 0:
        raise BadInput(f"--timeout {timeout_s:g}: must be positive")
    if sim_profile and backend != "sim":
        raise BadInput("--sim-profile goes with --backend sim")
    backend = resolve_backend(backend)
    devs = parse_devices(devices)
    fabric = None
    if backend == "cuda":
        available, why = gpu_count()
        if not available:
            raise EnvironmentMissing(f"--backend cuda: {why}",
                                     hint="use --backend cpu to run without GPUs")
    elif backend == "sim":
        from pcieprof.sim.fabric import load_profile

        fabric = load_profile(sim_profile or "rtxpro6000-8x-vm")
        available = len(fabric.gpus)
    else:
        available = MAX_CPU_RANKS
    devs = resolve_devices(backend, devs, nranks, available)
    chosen = V.parse_variants(variants)
    kinds = [k.strip() for k in groups.split(",") if k.strip()] if groups else None
    for k in kinds or []:
        if k not in V.GROUP_KINDS:
            raise BadInput(f"unknown group {k!r}", hint="pairs or tp4")
    ring_orders = [V.parse_order(o, devs) for o in orders]
    cap = parse_size(max_size)
    wanted = {t.strip() for t in probe_set.split(",") if t.strip()}
    if not wanted or wanted - {"copies", "allreduce"}:
        raise BadInput(f"--probes {probe_set!r}", hint="copies, allreduce or both")
    out = out or default_out_dir("topology")
    bundle = Bundle.create(out, command="topology", source=source_of(backend), backend=backend,
                           force=force)
    progress.info(f"bundle: {bundle.path}")
    runner = None
    t0 = time.monotonic()
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if backend == "sim":  # the fabric's own tree picks the shared-uplink flows
            from pcieprof.sim.fabric import topology as fabric_topology

            assert fabric is not None  # loaded above for the sim backend
            topo: dict[str, Any] = fabric_topology(fabric)
        else:
            topo = discover_into(bundle, backend)
        plan = build_plan(backend, devs, quick=quick, variants=chosen, group_kinds=kinds,
                          orders=ring_orders, p2p_sweep=p2p_sweep, timeout_s=timeout_s,
                          topology=topo, max_size=cap)
        if "copies" not in wanted:
            plan.p2p, plan.concurrent = [], []
        if "allreduce" not in wanted:
            plan.allreduce = []
        bundle.write_json("plan.json", plan.to_dict())
        if backend == "sim":
            _run_sim(bundle, plan, sim_profile or "rtxpro6000-8x-vm")
        else:
            from pcieprof.probe_runner import Launch, ProbeRunner

            runner = ProbeRunner(bundle, plan, Launch(nnodes=nnodes, rdzv_endpoint=rdzv_endpoint))
            parts = (["p2p", "concurrent"] if plan.p2p else []) + (["allreduce"] if plan.allreduce else [])
            for part in parts:
                bundle.set_part(part, "running")
            if plan.p2p:
                progress.info(f"copies: {len(plan.p2p)} P2P cases, {len(plan.concurrent)} "
                              f"concurrent patterns over {plan.nranks} "
                              f"{'ranks' if backend == 'cpu' else 'GPUs'}")
                with progress.task("P2P copies", total=len(plan.p2p)) as t:
                    runner.on_progress = lambda table, n: t.advance(n) if table == "p2p" else None
                    copies = runner.run_copies()
                for part, res in copies.items():
                    bundle.set_part(part, res["status"], why=res["why"], cases=res["rows"],
                                    hangs=res["hangs"], errors=res["errors"])
            if plan.allreduce:
                ar = runner.run_allreduce()
                bundle.set_part("allreduce", ar["status"], why=ar["why"], cases=ar["cases"],
                                hangs=ar["hangs"], errors=ar["errors"])
        wall = time.monotonic() - t0
        if not no_report:
            _report(bundle)
        status = bundle.finish()
    except KeyboardInterrupt as exc:
        if runner is not None:
            runner.kill()
        how = "SIGTERM" if isinstance(exc, _Terminated) else "Ctrl-C"
        bundle.interrupted(f"interrupted ({how}); rows measured so far are kept")
        click.echo(f"pcieprof: interrupted ({how}); partial bundle at {bundle.path}", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except BaseException as exc:
        if runner is not None:
            runner.kill()
        bundle.interrupted(f"stopped by an error: {exc}")
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
        if runner is not None:
            runner.cleanup()
    from pcieprof.summary import summarize

    click.echo(summarize(bundle))
    click.echo("")
    click.echo(f"bundle ({status}, {wall:.0f} s of probes): {bundle.path}")
    if bundle.has("report.html"):
        click.echo(f"report: {bundle.path / 'report.html'}")
    click.echo(f"rebuild the report: pcieprof report {bundle.path}")


def _run_sim(bundle: Bundle, plan: Any, profile: str) -> None:
    from pcieprof.sim.backend import run_plan

    for part in ("discovery", "p2p", "concurrent", "allreduce"):
        bundle.set_part(part, "running", source="simulated", backend="sim")
    run_plan(plan, profile, bundle)
    for part in ("discovery", "p2p", "concurrent", "allreduce"):
        if bundle.part(part).get("status") == "running":
            bundle.set_part(part, "ok")


def _report(bundle: Bundle) -> None:
    from pcieprof.report import write_report

    bundle.set_part("report", "running")
    try:
        write_report([bundle.path], bundle.path / "report.html")
    except PcieprofError as exc:
        bundle.set_part("report", "failed", why=exc.one_line())
        progress.warn(f"report: {exc.one_line()}")
        return
    bundle.register("report.html")
    bundle.set_part("report", "ok")
