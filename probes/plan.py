"""Building the measurement plan: every case `pcieprof topology` measures.

`build_plan` makes a `pcieprof.bundle.plan.Plan` (the typed document plan.json holds; its cases
live there too); the runner writes it, and each torchrun worker (probes.p2p_worker,
probes.allreduce_worker) reads the part it runs. The sim backend (pcieprof.sim.backend.run_plan)
reads the same plan and writes the rows a real run would.

Device numbers are NVML / nvidia-smi indices (PCI bus order) on `cuda` (the runner sets
CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA ordinals agree), and process ranks on `cpu`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from pcieprof.bundle.plan import AllReduceCase, ConcurrentCase, P2PCase, Plan
from pcieprof.errors import BadInput
from probes import variants as V

KiB = 1024
MiB = 1024 * 1024

PATHS = ("p2p", "host_staged", "h2d", "d2h")
DIRECTIONS = ("uni", "bi")
OPS = ("write", "read")
PATTERNS = ("ring", "shared_uplink", "all_to_all")
DTYPES = ("bf16", "fp32")


def sizes_pow2(lo: int, hi: int) -> list[int]:
    """Sizes lo, 2*lo, ..., hi in bytes (factor 2, both ends included when powers of two)."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def iters_for(size_bytes: int, iters: int, budget_bytes: int = 512 * MiB, floor: int = 3) -> int:
    """Timed iterations at one message size: `iters`, cut so that one size moves about
    `budget_bytes`, but never fewer than `floor` (so a median exists)."""
    return max(floor, min(iters, budget_bytes // max(size_bytes, 1)))


#: nvidia-smi topo -m levels, nearest first.
_LEVEL_RANK = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6}


def shared_uplink_flows(devices: list[int], topology: dict[str, Any] | None
                        ) -> tuple[list[tuple[int, int]], str]:
    """Two flows whose sources share a switch uplink, towards destinations under other root ports.

    Uses topology.json's `pcie_tree.gpu_paths` (GPU -> ... -> root port) when present: two GPUs
    with the same parent switch, and two destinations under two different root ports other than
    theirs. Without it, assumes the common layout where consecutive GPUs share a switch
    (d0, d1 -> d2, d3) and says so.
    """
    paths = ((topology or {}).get("pcie_tree") or {}).get("gpu_paths") or {}
    level = {(int(p["a"]), int(p["b"])): str(p.get("level") or "")
             for p in (topology or {}).get("pairs") or [] if "a" in p and "b" in p}
    level.update({(b, a): v for (a, b), v in list(level.items())})
    parent: dict[int, str] = {}
    root: dict[int, str] = {}
    for k, p in paths.items():
        try:
            g = int(k)
        except ValueError:
            continue
        if g in devices and isinstance(p, list) and len(p) >= 2:
            # p[1] is the switch downstream port; the switch itself is the next hop, so use the
            # upstream port (p[2]) when the path has one.
            parent[g] = p[2] if len(p) >= 4 else p[1]
            root[g] = p[-1]
    for a in devices:
        for b in devices:
            if b <= a or a not in parent or parent.get(b) != parent[a]:
                continue
            others = [d for d in devices if d not in (a, b) and root.get(d) not in (None, root[a])]
            # Farthest destinations first (SYS before NODE ...): a nearby root port may share the
            # sources' switch chip, where writes turn round without crossing the uplink.
            others.sort(key=lambda d: -_LEVEL_RANK.get(level.get((a, d), ""), 0))
            for c in others:
                for e in others:
                    if e != c and root[e] != root[c]:
                        return [(a, c), (b, e)], (f"GPUs {a},{b} share switch uplink {parent[a]}; "
                                                  f"destinations under root ports {root[c]}, {root[e]}")
    if len(devices) < 4:
        return [], "needs 4 devices"
    d = devices
    return [(d[0], d[2]), (d[1], d[3])], ("assumed layout: no PCIe tree, consecutive devices "
                                          "taken to share a switch")


def ring_order_case(case: AllReduceCase, other: list[int], *, gloo: bool = False
                    ) -> AllReduceCase:
    """An NCCL_ALGO=Ring case of a ring order (`case.ranks` not ascending) or of its baseline
    (ascending), its detail naming the other of the pair (`other`, its ranks). On gloo
    (`gloo`), which reads no NCCL_ALGO, the detail says the pair is two rank orders only."""
    if list(case.ranks) != sorted(case.ranks):
        said = ("gloo has no ring to force, only this rank order" if gloo
                else "NCCL_ALGO=Ring: the ring order runs at every size")
        said += f"; its baseline is {ring_label(case.variant, other)}"
    else:
        said = (f"{'' if gloo else 'NCCL_ALGO=Ring '}baseline of ring order "
                f"{','.join(map(str, other))}: the same {'ranks' if gloo else 'GPUs'} in plain "
                "order")
    return AllReduceCase(**{**asdict(case), "detail": "; ".join(x for x in (case.detail, said)
                                                                  if x)})


def ring_label(variant: str, ranks: list[int]) -> str:
    """`variant@0-1-2` (AllReduceCase.label of a one-node case)."""
    return f"{variant}@{'-'.join(map(str, ranks))}"


def build_plan(backend: str, devices: list[int], *, quick: bool = False,
               variants: list[V.Variant] | None = None, group_kinds: list[str] | None = None,
               orders: list[list[int]] | None = None, p2p_sweep: bool = False,
               timeout_s: float = 60.0, topology: dict[str, Any] | None = None,
               max_size: int | None = None, extra_sizes: Sequence[int] = (),
               nnodes: int = 1) -> Plan:
    """The measurement plan of one run.

    Args:
        backend: `cuda`, `cpu` or `sim`.
        devices: GPU indices (cuda/sim) or ranks 0..n-1 (cpu); at least one.
        quick: the short plan (all-reduce 8 B..64 MiB, fewer trials, quick variant list).
        variants: all-reduce variants (default: `QUICK_VARIANTS[backend]` with quick, else
            `DEFAULT_VARIANTS`, the ones a recommendation rule reads: the 8-GPU plan then stays
            under 10 minutes at probes/plan_time.py's assumed rates).
        group_kinds: groups each run over besides `all`: `pairs`, `tp2`, `tp4` (default variant
            only, to keep the launch count sane). Default: none with quick, else tp2 and tp4,
            the groups TP2 and TP4 layouts use (every pair, `pairs`, is 28 cases on 8 GPUs: the
            default plan would take about half an hour, probes/plan_time.py).
        orders: extra ring orders, e.g. [[0, 2, 1, 3]]: each runs with the default variant
            and with NCCL_ALGO=Ring (algo_ring), the latter beside its baseline, algo_ring over
            the same GPUs in plain order (once per group, and not again where the plan has it).
        p2p_sweep: add a uni-directional p2p bandwidth sweep (64 KiB..max, factor 4) per pair.
        timeout_s: deadline per copy / collective, seconds.
        topology: topology.json, used to pick shared-uplink flows.
        max_size: cap on every message and copy size, bytes (short runs, tests).
        extra_sizes: all-reduce sizes measured besides the powers of two, bytes (the decode
            band's: numbers quoted there are then measured, not interpolated).
        nnodes: nodes of the run. Above 1 every all-reduce case runs `devices` on every node
            (one device per node is a valid cross-node all-reduce), and the default variant
            also runs on node 0 alone (`node0_only`), the intra-node reference.

    Raises:
        BadInput: no devices, duplicate devices, an unknown backend or nnodes below 1.
    """
    _check_run(backend, devices, nnodes)
    cpu = backend == "cpu"
    cap = max_size if max_size is not None else 1 << 62
    if cap < 8:
        raise BadInput(f"max size {cap} B: needs at least 8 B")
    copies = _CopySettings.of(quick, cpu, cap)
    p2p = _p2p_cases(devices, copies, p2p_sweep)
    concurrent = _concurrent_cases(devices, topology, quick, cpu, cap)
    allreduce: list[AllReduceCase] = []
    if len(devices) * nnodes >= 2:
        ar = _AllReduceSettings.of(quick, cpu, cap, extra_sizes)
        chosen = variants if variants is not None else [
            V.VARIANTS[v] for v in (V.QUICK_VARIANTS[backend] if quick else V.DEFAULT_VARIANTS)]
        kinds = group_kinds if group_kinds is not None else ([] if quick else ["tp2", "tp4"])
        allreduce = _allreduce_cases(devices, ar, chosen, kinds, orders or [], nnodes)
    return Plan(backend=backend, devices=list(devices), p2p=p2p, concurrent=concurrent,
                allreduce=allreduce, timeout_s=float(timeout_s), quick=quick, nnodes=nnodes)


def _check_run(backend: str, devices: list[int], nnodes: int) -> None:
    if backend not in ("cuda", "cpu", "sim"):
        raise BadInput(f"unknown backend {backend!r}", hint="cuda, cpu or sim")
    if not devices:
        raise BadInput("no devices to measure")
    if len(set(devices)) != len(devices):
        raise BadInput(f"devices repeat: {devices}")
    if nnodes < 1:
        raise BadInput(f"nnodes {nnodes}: needs at least 1")


@dataclass(frozen=True)
class _CopySettings:
    """Sizes and repeats of the point-to-point copies."""

    bw_size: int  # bytes of a bandwidth copy
    bw_iters: int
    trials: int
    lat_sizes: tuple[int, ...]  # bytes of the latency copies
    lat_iters: int

    @classmethod
    def of(cls, quick: bool, cpu: bool, cap: int) -> _CopySettings:
        # Large copies: 64 MiB (nvbandwidth uses 512 MiB buffers, cuda-samples'
        # p2pBandwidthLatencyTest 10M ints, 40 MB: at 64 MiB a PCIe Gen5 x16 copy takes over 1 ms,
        # thousands of CUDA event resolutions; 256 MiB made the 8-GPU plan's copies 4x longer for
        # the same figure, issue 23). On cpu the copies are host memcpy through /dev/shm, where
        # 16 MiB already reaches steady state.
        bw_size = (16 * MiB if quick else 64 * MiB) if cpu else 64 * MiB
        return cls(bw_size=min(bw_size, cap), bw_iters=2 if (quick or cpu) else 5,
                   trials=3 if quick else 5, lat_sizes=(8,) if quick else (8, 4 * KiB),
                   lat_iters=50 if quick else 200)


def _p2p_cases(devices: list[int], c: _CopySettings, p2p_sweep: bool) -> list[P2PCase]:
    """Every ordered pair over peer and host-staged copies, each device to and from the host,
    and the optional bandwidth sweep per pair."""
    p2p: list[P2PCase] = []
    pairs = [(a, b) for a in devices for b in devices if a != b]
    for path in ("p2p", "host_staged"):
        for a, b in pairs:
            p2p.append(P2PCase(a, b, path, "uni", "bandwidth", c.bw_size, c.bw_iters, c.trials))
            if a < b:
                p2p.append(P2PCase(a, b, path, "bi", "bandwidth", c.bw_size, c.bw_iters, c.trials))
            for s in c.lat_sizes:
                p2p.append(P2PCase(a, b, path, "uni", "latency", s, c.lat_iters, c.trials))
    for d in devices:
        p2p.append(P2PCase(-1, d, "h2d", "uni", "bandwidth", c.bw_size, c.bw_iters, c.trials))
        p2p.append(P2PCase(d, -1, "d2h", "uni", "bandwidth", c.bw_size, c.bw_iters, c.trials))
        for s in c.lat_sizes:
            p2p.append(P2PCase(-1, d, "h2d", "uni", "latency", s, c.lat_iters, c.trials))
            p2p.append(P2PCase(d, -1, "d2h", "uni", "latency", s, c.lat_iters, c.trials))
    if p2p_sweep:
        for a, b in pairs:
            for s in sizes_pow2(64 * KiB, c.bw_size)[::2]:
                if s != c.bw_size:
                    p2p.append(P2PCase(a, b, "p2p", "uni", "bandwidth", s, c.bw_iters, c.trials))
    return p2p


def _concurrent_cases(devices: list[int], topology: dict[str, Any] | None, quick: bool,
                      cpu: bool, cap: int) -> list[ConcurrentCase]:
    """A ring, two flows sharing a switch uplink (where there are such) and all-to-all, each
    writing and reading."""
    concurrent: list[ConcurrentCase] = []
    cc_size = min(8 * MiB if cpu else (32 * MiB if quick else 64 * MiB), cap)
    cc_iters = 2 if (quick or cpu) else 5
    n = len(devices)
    if n < 2:
        return concurrent
    pairs = [(a, b) for a in devices for b in devices if a != b]
    ring = ([(devices[i], devices[(i + 1) % n]) for i in range(n)] if n > 2
            else [(devices[0], devices[1])])
    up, up_detail = shared_uplink_flows(devices, topology)
    for op in ("write", "read"):
        concurrent.append(ConcurrentCase("ring", op, list(ring), cc_size, cc_iters))
        if up:
            concurrent.append(ConcurrentCase("shared_uplink", op, up, cc_size, cc_iters,
                                             up_detail))
        concurrent.append(ConcurrentCase("all_to_all", op, list(pairs), cc_size, cc_iters))
    return concurrent


@dataclass(frozen=True)
class _AllReduceSettings:
    """What every all-reduce case of a plan shares."""

    sizes: list[int]  # bytes
    warmup: int
    iters: int
    gloo: bool  # the cpu backend: gloo reads no NCCL_* variable

    @classmethod
    def of(cls, quick: bool, cpu: bool, cap: int, extra_sizes: Sequence[int]) -> _AllReduceSettings:
        top = min(64 * MiB if quick else 256 * MiB, cap)
        sizes = sorted(set(sizes_pow2(8, top)) | {int(s) for s in extra_sizes if 8 <= s <= top})
        warmup, iters = (2, 10) if quick else (5, 20)
        if cpu:  # gloo on a few host cores: the harness, not a fabric; fewer repeats suffice
            warmup, iters = (1, 5) if quick else (2, 10)
        return cls(sizes, warmup, iters, cpu)

    def case(self, v: V.Variant, ranks: list[int]) -> AllReduceCase:
        ignored = self.gloo and any(k.startswith("NCCL_") for k in v.env)
        return AllReduceCase(v.name, dict(v.env), list(ranks), list(self.sizes), list(DTYPES),
                             self.warmup, self.iters, V.GLOO_IGNORES_NCCL if ignored else "")


def _allreduce_cases(devices: list[int], ar: _AllReduceSettings, chosen: list[V.Variant],
                     kinds: list[str], orders: list[list[int]], nnodes: int) -> list[AllReduceCase]:
    """Every chosen variant over all devices, the default one over each group and ring order,
    the NCCL_ALGO=Ring pairs of the orders, and node 0's own case of a multi-node run."""
    allreduce = [ar.case(v, devices) for v in chosen]
    base = V.VARIANTS["default"]
    for kind in kinds:
        for g in V.groups(devices, kind):
            if g != list(devices):
                allreduce.append(ar.case(base, g))
    for order in orders:
        allreduce.append(ar.case(base, order))
    _add_ring_order_pairs(allreduce, ar, orders)
    if nnodes > 1 and len(devices) >= 2:  # last: the other nodes go on with their copies meanwhile
        allreduce.append(AllReduceCase(**{**asdict(ar.case(base, devices)), "node0_only": True}))
    return allreduce


def _add_ring_order_pairs(allreduce: list[AllReduceCase], ar: _AllReduceSettings,
                          orders: list[list[int]]) -> None:
    # A graph file sets the ring graph only and the tuner may still pick the tree (issue 23
    # pt 3): each order also runs with NCCL_ALGO=Ring, beside its baseline, the same GPUs in
    # plain order with NCCL_ALGO=Ring, so that the two differ in the order alone at every
    # size. gloo reads neither: there both are the same rank order measured again.
    only_ring = V.VARIANTS["algo_ring"]
    for order in orders:
        plain = sorted(order)
        allreduce.append(ring_order_case(ar.case(only_ring, order), plain, gloo=ar.gloo))
        if not any(c.variant == only_ring.name and c.ranks == plain for c in allreduce):
            allreduce.append(ring_order_case(ar.case(only_ring, plain), order, gloo=ar.gloo))
