"""`pcieprof topology`: discover this machine, probe P2P copies and all-reduce, write a bundle and
a report.

Backends: `cuda` (real GPUs, NCCL), `cpu` (gloo and host memory copies between local processes:
measures this machine and the harness), `sim` (the fabric model), `auto` (cuda when NVML and torch
see GPUs, else cpu, said in one line).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

import click

from pcieprof import progress
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle, default_out_dir
from pcieprof.cards import DEFAULT_CARD, ModelCard, load_card
from pcieprof.commands.options import out_dir, verbosity
from pcieprof.commands.recommend import save_for_report
from pcieprof.errors import BadInput, EnvironmentMissing, ExitCode, PcieprofError
from pcieprof.measurement import (
    MeasurementSession,
    available_devices,
    resolve_backend,
    resolve_devices,
)
from pcieprof.node_group import parse_endpoint, read_token
from pcieprof.probe_runner import Launch
from pcieprof.report.context import ReportContext
from pcieprof.report.console import summarize
from pcieprof.schema import source_of
from pcieprof.sim.fabric import DEFAULT_PROFILE
from probes import variants as V
from pcieprof.bundle.plan import Plan
from probes.plan import build_plan
from probes.plan_time import estimate


#: NCCL's system-configuration variables that choose the network between nodes (NCCL user
#: guide, Environment Variables, "System configuration":
#: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html): a multi-node run keeps
#: them from the user's shell (recorded as kept in nccl_choices.json); every other NCCL_* is left
#: out so that each variant measures its own settings.
NETWORK_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX")


def node_launch(nnodes: int, node_rank: int | None, endpoint: str | None,
                timeout_s: float, token_file: str | None = None) -> Launch:
    """The run's node options, checked.

    Raises:
        BadInput: --nnodes below 1, several nodes without --node-rank or --rdzv-endpoint, a
            node rank out of range, a bad endpoint or timeout, no shared token (read_token).
    """
    if nnodes < 1:
        raise BadInput(f"--nnodes {nnodes}: needs at least 1")
    if nnodes == 1:
        if node_rank not in (None, 0):
            raise BadInput(f"--node-rank {node_rank} needs --nnodes above 1")
        if endpoint:  # unused on one node, but a typo in it is refused, not passed over
            parse_endpoint(endpoint)
        return Launch()
    if node_rank is None:
        raise BadInput(f"--nnodes {nnodes} needs --node-rank",
                       hint="0 on the node at --rdzv-endpoint, 1.. on the others")
    if not 0 <= node_rank < nnodes:
        raise BadInput(f"--node-rank {node_rank} is not in 0..{nnodes - 1}")
    if not endpoint:
        raise BadInput(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (node 0's address)")
    parse_endpoint(endpoint)
    if timeout_s <= 0:
        raise BadInput(f"--rdzv-timeout {timeout_s:g}: must be positive")
    read_token(token_file)  # checked before the bundle exists; read again at the join
    return Launch(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=endpoint.strip(),
                  rdzv_timeout_s=timeout_s, rdzv_token_file=token_file)


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


@click.command("topology")
@click.option("--backend", type=click.Choice(["auto", "cuda", "cpu", "sim"]), default="auto",
              show_default=True, help="cuda: real GPUs and NCCL; cpu: gloo and host copies between "
              "local processes (measures this machine); sim: the fabric model.")
@click.option("--sim-profile", default=None, metavar="NAME|FILE.toml",
              help=f"Fabric profile for --backend sim (default {DEFAULT_PROFILE}).")
@click.option("--devices", default=None, metavar="0,1,..", help="GPU indices (nvidia-smi order).")
@click.option("--nranks", type=int, default=None, help="Number of ranks / GPUs (0..N-1).")
@click.option("--quick", is_flag=True, help="Short plan: all-reduce 8 B..64 MiB, 3 variants.")
@click.option("--variants", default=None, metavar="a,b|all",
              help="All-reduce variants: default, p2p_disable, p2p_level_sys, proto_ll, "
              "proto_simple, algo_ring, algo_tree, nch2, nch8, or all (default: the ones "
              "recommend's rules read, default,p2p_disable,p2p_level_sys,proto_ll,nch8; with "
              "--quick default,p2p_disable,proto_ll). Each adds two launches on GPUs.")
@click.option("--groups", default=None, metavar="tp2,tp4",
              help="Also run the default variant over sub-groups: the TP2 pairs (0-1, 2-3, ...), "
              "the TP4 groups, or every pair (`pairs`: 28 cases on 8 GPUs) (default: tp2,tp4 "
              "without --quick, none with it).")
@click.option("--ring-order", "orders", multiple=True, metavar="0,2,1,3",
              help="Also run the default variant over this GPU order, and algo_ring "
                   "(NCCL_ALGO=Ring) over it beside algo_ring over the same GPUs in plain "
                   "order, its baseline (repeatable).")
@click.option("--p2p-sweep", is_flag=True, help="Add a P2P bandwidth size sweep per pair.")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True,
              help="Deadline of each copy / collective, seconds; past it the launch is killed "
              "and recorded as status=hang.")
@click.option("--max-size", default=None, metavar="BYTES|64KiB",
              help="Cap on every copy and all-reduce message size (a short run).")
@click.option("--nnodes", type=int, default=1, show_default=True,
              help="Nodes of a multi-node run: run the same command on each, with its own "
              "--node-rank; every all-reduce case spans the nodes, the copy probes stay on each.")
@click.option("--node-rank", type=int, default=None,
              help="This node's rank (several nodes): 0 on the node at --rdzv-endpoint, which "
              "holds global rank 0 and gets every all-reduce row; 1.. on the others.")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT",
              help="Node 0's address and a free port (several nodes): node 0 listens there, the "
              "others connect; each all-reduce launch gets its own torchrun port from node 0.")
@click.option("--rdzv-timeout", "rdzv_timeout_s", type=float, default=120.0, show_default=True,
              help="Seconds the nodes wait for each other to join; past it the run ends with one "
              "line naming the missing node (exit 3).")
@click.option("--rdzv-token-file", default=None, metavar="PATH",
              help="File holding the secret every node shares (several nodes; at least 16 bytes; "
              "default: $PCIEPROF_RDZV_TOKEN): a node proves it before the others accept "
              "anything from it.")
@click.option("--probes", "probe_set", default="copies,allreduce", show_default=True,
              metavar="copies,allreduce", help="Which probes to run: the copy probes (P2P matrix, "
              "h2d/d2h, concurrent traffic) and/or the all-reduce sweep.")
@click.option("--model", default=DEFAULT_CARD, show_default=True,
              help="Model card the run is measured for: its decode all-reduce sizes join the "
              "sweep (and, --backend sim with a VM profile, its decode step is priced against "
              "bare metal). A shipped card's name, a .toml card, a config.json (or its checkpoint "
              "directory) or a Hugging Face repository id in the local cache.")
@click.option("--no-report", is_flag=True, help="Do not write report.html.")
@out_dir
@verbosity
def command(backend: str, sim_profile: str | None, devices: str | None, nranks: int | None,
            quick: bool, variants: str | None, groups: str | None, orders: tuple[str, ...],
            p2p_sweep: bool, timeout_s: float, max_size: str | None, nnodes: int,
            node_rank: int | None, rdzv_endpoint: str | None, rdzv_timeout_s: float,
            rdzv_token_file: str | None, probe_set: str, model: str, no_report: bool, out: Path | None, force: bool) -> None:
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
    --ring-order is applied through NCCL_GRAPH_FILE and checked against the rings NCCL logged;
    it also runs with NCCL_ALGO=Ring beside the same GPUs in plain order (the tuner may pick
    the tree at some sizes otherwise).
    NCCL_* / TORCH_NCCL_* variables of your shell are not passed on (recorded in
    nccl_choices.json). Details: docs/probes.md.

    Several nodes: `pcieprof topology --nnodes 2 --node-rank 0 --rdzv-endpoint HOST:PORT` on the
    node at HOST, the same with `--node-rank 1` on the other. Node 0's bundle gets every
    all-reduce row (ranks numbered node_rank x stride + device), the others' manifests say where
    they are; each bundle holds its own node's discovery and copy probes.
    """
    if not sys.platform.startswith("linux"):
        raise EnvironmentMissing(f"pcieprof topology needs Linux (this is {platform.system()})")
    if timeout_s <= 0:
        raise BadInput(f"--timeout {timeout_s:g}: must be positive")
    if sim_profile and backend != "sim":
        raise BadInput("--sim-profile goes with --backend sim")
    launch = node_launch(nnodes, node_rank, rdzv_endpoint, rdzv_timeout_s, rdzv_token_file)
    backend = resolve_backend(backend)
    if backend == "sim" and nnodes > 1:
        raise BadInput("--backend sim models one box", hint="drop --nnodes")
    devs = parse_devices(devices)
    available = available_devices(backend, sim_profile)
    devs = resolve_devices(backend, devs, nranks, available)
    chosen = V.parse_variants(variants)
    kinds = [k.strip() for k in groups.split(",") if k.strip()] if groups else None
    for k in kinds or []:
        if k not in V.GROUP_KINDS:
            raise BadInput(f"unknown group {k!r}", hint="tp2, tp4 or pairs")
    if orders and nnodes > 1:  # a ring order is a permutation of one node's GPUs
        raise BadInput("--ring-order orders the GPUs of one node", hint="drop --nnodes for it")
    ring_orders = [V.parse_order(o, devs) for o in orders]
    cap = parse_size(max_size)
    wanted = {t.strip() for t in probe_set.split(",") if t.strip()}
    if not wanted or wanted - {"copies", "allreduce"}:
        raise BadInput(f"--probes {probe_set!r}", hint="copies, allreduce or both")
    card = load_card(model)
    band = DecodeBand.of_card(card)  # its message sizes join the all-reduce sweep
    out = out or default_out_dir("topology")
    bundle = Bundle.create(out, command="topology", source=source_of(backend), backend=backend,
                           force=force, inputs=[model] if Path(model).exists() else [])
    bundle.set_model(card)
    progress.info(f"bundle: {bundle.path} (decode sizes of {card.name})")
    t0 = time.monotonic()
    with MeasurementSession(bundle, sim_profile=sim_profile, launch=launch,
                            card=card) as session:
        session.join(devs, backend)  # several nodes: once, before anything is measured
        topo = session.machine(backend)
        plan = build_plan(backend, devs, quick=quick, variants=chosen, group_kinds=kinds,
                          orders=ring_orders, p2p_sweep=p2p_sweep, timeout_s=timeout_s,
                          topology=topo, max_size=cap, extra_sizes=band.sizes(), nnodes=nnodes)
        if nnodes > 1:  # NCCL has to find the network between the nodes as the user set it up
            plan.keep_env = sorted(k for k in os.environ if k in NETWORK_ENV)
        if "copies" not in wanted:
            plan.p2p, plan.concurrent = [], []
        if "allreduce" not in wanted:
            plan.allreduce = []
        bundle.write_doc(plan)
        progress.info(f"plan: {expected_line(plan)}")
        session.measure(plan)
        nothing = session.nothing_measured()
    wall = time.monotonic() - t0
    status = bundle.finish()
    if not no_report:  # after finish(): the report shows the bundle as it stays
        _report(bundle, card, band)
    click.echo(summarize(bundle, band))
    click.echo("")
    click.echo(f"bundle ({status}, {wall:.0f} s of probes): {bundle.path}")
    nodes = bundle.nodes()
    if nodes is not None and nodes.node_rank != 0:
        click.echo(f"all-reduce rows of the {nodes.describe(backend)} run: "
                   f"{nodes.collective_rows}")
    if bundle.has("report.html"):
        click.echo(f"report: {bundle.path / 'report.html'}")
    click.echo(f"rebuild the report: pcieprof report {bundle.path}")
    if nothing:
        raise PcieprofError(f"{nothing}; bundle: {bundle.path}", exit_code=ExitCode.MEASUREMENT,
                            hint="the logs under logs/ and nccl/ say why each launch failed")


def expected_line(plan: Plan) -> str:
    """What the plan runs and how long it is expected to take (probes.plan_time); for the sim
    backend, how long the same plan would take on the GPUs (the model itself takes seconds)."""
    if plan.backend != "sim":
        return estimate(plan).describe()
    on_gpus = estimate(dataclasses.replace(plan, backend="cuda"))
    return f"simulated in seconds; on these GPUs (cuda): {on_gpus.describe()}"


def _report(bundle: Bundle, card: ModelCard, band: DecodeBand) -> None:
    """report.html of the finished bundle, after `recommend`'s result is saved into it (the
    report draws what is saved); a report that cannot be written is a warning and a failed
    `report` part, not a failed run."""
    why: str | None = None
    try:
        from pcieprof.report import write_report  # heavy: plotly, absent on a bare GPU box

        unsaved = save_for_report([bundle], card, band)
        write_report([bundle], bundle.path / "report.html",
                     ctx=ReportContext(band=band, unsaved=unsaved))
    except PcieprofError as exc:
        why = exc.one_line()
    except ImportError as exc:  # the measurements stand; the page can be drawn elsewhere
        why = (f"the report needs {exc.name or exc}: pip install {exc.name or 'plotly'}, then "
               f"pcieprof report {bundle.path}")
    except OSError as exc:  # a full disk: the data is written, the page can be drawn later
        why = (f"cannot write {bundle.path / 'report.html'} ({exc.strerror or exc}); once "
               f"there is room: pcieprof report {bundle.path}")
    if why is not None:
        progress.warn(f"report: {why}")
    try:
        if why is None:
            bundle.register("report.html")
        bundle.set_part("report", "ok" if why is None else "failed", why=why)
    except OSError as exc:  # the disk is full: the data stands, the manifest says no more
        progress.warn(f"report: not recorded in the manifest ({exc.strerror or exc})")
