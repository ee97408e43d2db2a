"""The measurement session: one place that runs a measurement plan into a bundle.

Used by `pcieprof topology`, `pcieprof recommend --verify` (through the command) and
`python -m pcieprof.selftest`. It owns what every measuring run needs:
- backend dispatch: `cuda` and `cpu` run the plan's probes under torchrun
  (pcieprof.probe_runner), `sim` runs it against the fabric model (pcieprof.sim.backend);
  `auto` picks cuda when NVML and torch see GPUs, else cpu, and says so;
- part status in the manifest (`running`, then `ok` / `partial` / `failed` with why);
- signals: SIGTERM is handled like Ctrl-C; either kills the running launch, marks the bundle
  partial (rows measured so far are kept) and ends the command with exit status 130;
- several nodes: `join` meets the other nodes once, within the rendezvous deadline
  (pcieprof.node_group), and records the layout in the manifest (`nodes`); `measure` runs node
  0's all-reduce cases on every node, in step, before the copy probes, which stay on each node;
- cleanup of the runner's work directory.
"""

from __future__ import annotations

import signal
from types import FrameType, TracebackType
from typing import Any

from pcieprof import progress
from pcieprof.bundle import Bundle
from pcieprof.bundle.nodes import NodeInfo, NodeLayout
from pcieprof.bundle.topology import Topology
from pcieprof.cards import ModelCard
from pcieprof.discover import versions
from pcieprof.discover.nvml import device_count
from pcieprof.discover.topology import discover
from pcieprof.errors import BadInput, EnvironmentMissing, PcieprofError
from pcieprof.node_group import Member, NodeGroup, NodeLost, read_token
from pcieprof.peer_plan import accept_cases
from pcieprof.probe_runner import Launch, ProbeRunner
from pcieprof.sim.backend import run_plan
from pcieprof.sim.fabric import DEFAULT_PROFILE, load_profile
from pcieprof.sim.fabric import topology as fabric_topology
from probes import variants as V
from pcieprof.bundle.plan import Plan
from probes.plan import build_plan
from probes.plan_time import allreduce_case_s, copies_s, minutes

#: The cpu backend runs one process per rank on this machine; more than this is not a useful
#: picture of anything and would only thrash the cores.
MAX_CPU_RANKS = 16
#: The tables the probes fill (discovery alone is not a measurement).
MEASURED_TABLES = ("p2p", "concurrent", "allreduce")


def gpu_count() -> tuple[int, str]:
    """(GPUs that both NVML and torch see, why not when 0)."""
    n_nvml, why = device_count()
    if not n_nvml:
        return 0, why or "NVML sees no GPU"
    try:
        import torch  # heavy: torch

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


def available_devices(backend: str, sim_profile: str | None = None) -> int:
    """How many devices a backend can run on (cuda: GPUs NVML and torch see; sim: the profile's;
    cpu: the rank limit).

    Raises:
        EnvironmentMissing: `cuda` without usable GPUs.
        BadInput: an unknown sim profile.
    """
    if backend == "cuda":
        n, why = gpu_count()
        if not n:
            raise EnvironmentMissing(f"--backend cuda: {why}",
                                     hint="use --backend cpu to run without GPUs")
        return n
    if backend == "sim":
        return len(load_profile(sim_profile or DEFAULT_PROFILE).gpus)
    return MAX_CPU_RANKS


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


def allreduce_plan(backend: str, devices: list[int], cases: list[tuple[str, dict[str, str],
                   tuple[int, ...] | None, str]], sizes: list[int], *, timeout_s: float,
                   topology: Topology | None = None) -> Plan:
    """An all-reduce-only plan (bf16): one case per (name, env, ranks or None, description).

    Used by `recommend --verify`: the baseline and one case per recommendation, at the decode
    sizes plus one large size.
    """
    wanted = [V.Variant(name, dict(env), detail) for name, env, _, detail in cases]
    plan = build_plan(backend, devices, quick=True, variants=wanted, group_kinds=[],
                      timeout_s=timeout_s,
                      topology=topology.to_json() if topology is not None else None)
    plan.p2p, plan.concurrent = [], []
    orders = {name: ranks for name, _, ranks, _ in cases if ranks}
    for case in plan.allreduce:
        case.sizes, case.dtypes = list(sizes), ["bf16"]
        if case.variant in orders:
            case.ranks = list(orders[case.variant])
    return plan


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


def _on_sigterm(_signo: int, _frame: FrameType | None) -> None:
    raise _Terminated()


class MeasurementSession:
    """Runs measurement plans into one bundle (a context manager).

    Args:
        bundle: the bundle the rows go into (created by the caller).
        sim_profile: the fabric profile of the sim backend (DEFAULT_PROFILE when None).
        launch: torchrun node/rendezvous options (cuda/cpu).
        card: the model the run is measured for (sim: the decode a VM profile's like-for-like
            table prices; DEFAULT_CARD when None).

    Inside `with`, SIGTERM raises KeyboardInterrupt; on the way out an interrupt or an error
    kills the running launch and marks the bundle partial, and the runner's files are removed.
    """

    def __init__(self, bundle: Bundle, *, sim_profile: str | None = None,
                 launch: Launch | None = None, card: ModelCard | None = None) -> None:
        self.bundle = bundle
        self.card = card
        self.sim_profile = sim_profile or DEFAULT_PROFILE
        self.launch = launch or Launch()
        self.group: NodeGroup | None = None
        self._runner: ProbeRunner | None = None
        self._old: Any = None

    def __enter__(self) -> "MeasurementSession":
        self._old = signal.signal(signal.SIGTERM, _on_sigterm)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None:
                if self._runner is not None:
                    self._runner.kill()
                if isinstance(exc, KeyboardInterrupt):
                    how = "SIGTERM" if isinstance(exc, _Terminated) else "Ctrl-C"
                    # the CLI names the partial bundle (pcieprof.cli), once for every command
                    self.bundle.interrupted(f"interrupted ({how}); rows measured so far are kept")
                else:
                    self.bundle.interrupted(f"stopped by an error: {exc}")
        finally:
            signal.signal(signal.SIGTERM, self._old)
            if self.group is not None:
                self.group.close()
            if self._runner is not None:
                self._runner.cleanup()
                self._runner = None

    def machine(self, backend: str) -> dict[str, Any]:
        """What the plan is built on: the fabric profile's own tree for `sim` (its shared-uplink
        flows come from it; run_plan writes topology.json), discovery of this machine else."""
        if backend == "sim":
            return fabric_topology(load_profile(self.sim_profile))
        return self.discover().to_json()

    def discover(self) -> Topology:
        """Discovery (pcieprof.discover) into topology.json and the manifest's versions; a
        discovery bug costs the topology, never the measurements (part `discovery` partial)."""
        b = self.bundle
        b.set_part("discovery", "running")
        status, why = "ok", None
        try:
            topo = Topology.from_json(discover())
        except PcieprofError:
            raise
        except Exception as exc:  # a discovery bug must not cost the measurements
            topo = Topology(source="measured",
                            status={"discovery": f"error: {type(exc).__name__}: {exc}"})
            status, why = "partial", f"discovery failed: {exc}"
        try:
            b.set_versions(**versions())
        except Exception as exc:  # versions are facts for the manifest, not measurements
            progress.warn(f"versions: {exc}")
        b.write_doc(topo)
        b.set_part("discovery", status, why=why, gpus=len(topo.gpus))
        return topo

    def join(self, devices: list[int], backend: str) -> NodeLayout | None:
        """Several nodes: meet the others at the rendezvous endpoint, once, within its deadline,
        and record the layout in the manifest (`nodes`, pcieprof.bundle.nodes). None on one
        node.

        Raises:
            EnvironmentMissing: a node did not join in time (one line naming the endpoint and
                the node), or the endpoint cannot be listened on.
            BadInput: the nodes disagree (ranks, number of nodes, backend, devices).
        """
        la = self.launch
        if la.nnodes <= 1:
            return None
        stride = max(devices) + 1
        layout = NodeLayout(nnodes=la.nnodes, node_rank=la.node_rank,
                            rdzv_endpoint=la.rdzv_endpoint, rdzv_timeout_s=la.rdzv_timeout_s,
                            stride=stride)
        self.bundle.set_nodes(layout)  # a run that never joins still says what it tried
        me = Member.here(la.node_rank, str(self.bundle.path.resolve()), devices, backend)
        self.group = group = NodeGroup.join(str(la.rdzv_endpoint), la.nnodes, la.node_rank, me,
                                            la.rdzv_timeout_s,
                                            token=read_token(la.rdzv_token_file))
        layout.nodes = [NodeInfo(node_rank=r, host=m.host, pid=m.pid, bundle=m.bundle,
                                 devices=list(m.devices),
                                 gpus=[r * stride + d for d in m.devices])
                        for r, m in sorted(group.members.items())]
        node0 = group.members[0]
        layout.collective_rows = ("this bundle" if la.node_rank == 0
                                  else f"node 0 ({node0.host}): {node0.bundle}")
        self.bundle.set_nodes(layout)
        return layout

    def measure(self, plan: Plan) -> None:
        """Run `plan` with its backend into the bundle, setting the parts it measures."""
        if plan.backend == "sim":
            self._simulate(plan)
        else:
            self._probe(plan)

    def nothing_measured(self) -> str | None:
        """Why not one probe row of the bundle is `ok` when it has rows (every case failed,
        hung or was refused), else None: such a run measured nothing (exit 4)."""
        rows = [(t, str(s)) for t in MEASURED_TABLES
                for s in self.bundle.read_table(t)["status"].tolist()]
        if not rows or any(s == "ok" for _, s in rows):
            return None
        whys = [f"{t}: {getattr(self.bundle.part(t), 'why', None) or 'no row ok'}"
                for t in dict.fromkeys(t for t, _ in rows)]
        return f"no probe measured anything ({len(rows)} case(s), none ok): " + "; ".join(whys)

    def _simulate(self, plan: Plan) -> None:
        parts = ["p2p", "concurrent"] * bool(plan.p2p) + ["allreduce"] * bool(plan.allreduce)
        for part in parts:
            self.bundle.set_part(part, "running", source="simulated", backend="sim")
        run_plan(plan, self.sim_profile, self.bundle, self.card)
        for part in parts:
            if getattr(self.bundle.part(part), "status", None) == "running":
                self.bundle.set_part(part, "ok")

    def _share_plan(self, plan: Plan) -> None:
        """Several nodes: node 0 sends its all-reduce cases; the others take them (so every
        node runs the same cases in the same order) and say so in their plan.json."""
        group = self.group
        if group is None:
            return
        if group.leader:
            group.send_plan(plan.to_json())
            return
        try:
            # node 0 discovers its machine first (seconds; minutes at worst); a node 0 that is
            # gone is seen at once
            theirs = Plan.from_json(group.plan(self.launch.rdzv_timeout_s + 300.0),
                                   f"rendezvous {group.endpoint}: node 0's plan")
        except NodeLost as exc:
            raise EnvironmentMissing(f"rendezvous {group.endpoint}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadInput(f"rendezvous {group.endpoint}: node 0's plan is malformed ({exc})") \
                from None
        # only what this node's own command line could give: its deadlines and environment
        # stay its own, node 0 only picks (and orders) known variants over its devices
        plan.allreduce = accept_cases(plan, theirs.allreduce)
        if self.bundle.has("plan.json"):
            self.bundle.write_doc(plan)

    def _probe(self, plan: Plan) -> None:
        b = self.bundle
        group = self.group
        if group is not None and plan.nnodes != group.nnodes:
            raise BadInput(f"the plan spans {plan.nnodes} node(s), the run {group.nnodes}")
        self._share_plan(plan)
        self._runner = runner = ProbeRunner(b, plan, self.launch, group=group)
        for part in ["p2p", "concurrent"] * bool(plan.p2p) + ["allreduce"] * bool(plan.allreduce):
            b.set_part(part, "running")
        if group is not None and plan.allreduce:  # the nodes are there now: cross-node first
            self._allreduce(runner)
        if plan.p2p:
            progress.info(f"copies: {len(plan.p2p)} P2P cases, {len(plan.concurrent)} concurrent "
                          f"patterns over {plan.nranks} {'ranks' if plan.backend == 'cpu' else 'GPUs'}"
                          f", expected {minutes(copies_s(plan))}")
            with progress.task("P2P copies", total=len(plan.p2p)) as t:
                runner.on_progress = lambda table, n: t.advance(n) if table == "p2p" else None
                copies = runner.run_copies()
            for part, res in copies.items():
                b.set_part(part, res["status"], why=res["why"], cases=res["rows"],
                           hangs=res["hangs"], errors=res["errors"])
        if group is None and plan.allreduce:
            self._allreduce(runner)

    def _allreduce(self, runner: ProbeRunner) -> None:
        plan = runner.plan
        launches = 2 if plan.backend == "cuda" else 1
        steps = sum(len(c.sizes) * len(c.dtypes) * launches for c in plan.allreduce)
        expected = sum(allreduce_case_s(plan, k) for k in range(len(plan.allreduce)))
        progress.info(f"all-reduce: {len(plan.allreduce)} cases, {launches * len(plan.allreduce)} "
                      f"launches, expected {minutes(expected)}")
        # one step per size and dtype of every launch (each rank 0 `done`), so a case of a
        # minute is not silent
        with progress.task("all-reduce sizes", total=steps) as t:
            runner.on_progress = lambda what, n: t.advance(n) if what == "step" else None
            ar = runner.run_allreduce()
        extra = {k: ar[k] for k in ("not_run",) if ar.get(k)}
        nodes = self.bundle.nodes()
        if nodes is not None and nodes.node_rank != 0:
            extra["rows_in"] = nodes.collective_rows
        self.bundle.set_part("allreduce", ar["status"], why=ar["why"], cases=ar["cases"],
                             hangs=ar["hangs"], errors=ar["errors"], **extra)
