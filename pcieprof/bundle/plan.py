"""plan.json: the measurement plan, every case `pcieprof topology` measures.

The data shape lives here, in the bundle, so that the runner writes it and any reader opens it
as a typed document; probes/plan.py builds it (`build_plan`) and each torchrun worker
(probes.p2p_worker, probes.allreduce_worker) reads the part it runs from the file the runner
wrote. The sim backend (pcieprof.sim.backend.run_plan) reads the same plan.

Device numbers are NVML / nvidia-smi indices (PCI bus order) on `cuda` (the runner sets
CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA ordinals agree), and process ranks on `cpu`.
No format tag: the file never had one (schemas 1 to 3 read the same).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pcieprof.bundle.document import Document


@dataclass
class P2PCase:
    """One copy measurement (one p2p.csv row).

    Attributes:
        src: source device (for h2d: the GPU written to; the host end is -1 in the row).
        dst: destination device (-1 for h2d/d2h rows' host end; see `row_ends`).
        path: `p2p` (direct), `host_staged` (through pinned host memory), `h2d`, `d2h`.
        direction: `uni`, or `bi` (both directions at once; bandwidth is the sum).
        kind: `bandwidth` (large copies) or `latency` (small copies, time per copy).
        size_bytes: bytes per copy (per direction).
        iters: copies per trial.
        trials: timed trials; the row keeps their median, min and max.
    """

    src: int
    dst: int
    path: str
    direction: str
    kind: str
    size_bytes: int
    iters: int
    trials: int

    def row_ends(self) -> tuple[int, int]:
        """(src, dst) as p2p.csv writes them: for h2d/d2h the host end is -1."""
        if self.path == "h2d":
            return -1, self.dst
        if self.path == "d2h":
            return self.src, -1
        return self.src, self.dst


@dataclass
class ConcurrentCase:
    """Several copies at once (concurrent.csv rows: one per flow and the aggregate, flow=-1).

    Attributes:
        pattern: `ring` (each device to its ring neighbour), `shared_uplink` (two flows whose
            sources share a switch uplink, towards destinations under different root ports),
            `all_to_all` (every ordered pair).
        op: `write` (the source pushes) or `read` (the destination pulls).
        flows: (src, dst) per flow.
        size_bytes: bytes per copy per flow.
        iters: copies per flow.
        detail: how the flows were chosen (e.g. an assumed switch layout).
    """

    pattern: str
    op: str
    flows: list[tuple[int, int]]
    size_bytes: int
    iters: int
    detail: str = ""


@dataclass
class AllReduceCase:
    """One variant over one group: a fresh process group (a fresh torchrun launch).

    Attributes:
        variant: name in probes.variants.VARIANTS.
        env: environment of the launch (the variant's settings).
        ranks: devices in ring order (a CUDA_VISIBLE_DEVICES permutation on cuda).
        sizes: message sizes in bytes.
        dtypes: `bf16`, `fp32`.
        warmup: untimed all-reduces per size.
        iters: the most timed all-reduces per size (fewer at large sizes, see `iters_for`).
        detail: caveat written into every row (e.g. gloo ignoring NCCL_* settings).
        node0_only: in a multi-node plan, a case that runs on node 0 alone (the intra-node
            reference); every other case runs its ranks on every node.
        size_detail: caveat of the rows of one size ({size in bytes as a string: text}), after
            `detail` (e.g. a ring order NCCL's tuner did not use at that size).
    """

    variant: str
    env: dict[str, str]
    ranks: list[int]
    sizes: list[int]
    dtypes: list[str]
    warmup: int
    iters: int
    detail: str = ""
    node0_only: bool = False
    size_detail: dict[str, str] = field(default_factory=dict)

    def detail_at(self, size: int) -> str:
        """The `detail` of the rows of message size `size` (bytes)."""
        return "; ".join(x for x in (self.detail, self.size_detail.get(str(size), "")) if x)

    @property
    def label(self) -> str:
        """`variant` plus the group, unique within a plan (file names, progress)."""
        return f"{self.variant}@{'-'.join(map(str, self.ranks))}" + (
            ".node0" if self.node0_only else "")


@dataclass
class Plan(Document):
    """Everything one `pcieprof topology` run measures.

    Attributes:
        backend: `cuda`, `cpu` or `sim`.
        devices: the devices (GPU indices or cpu ranks) of the run.
        p2p: copy cases, in the order they run.
        concurrent: concurrent-traffic cases.
        allreduce: all-reduce cases, one launch each.
        timeout_s: deadline of each copy / collective; past it the launch is killed (status=hang).
        quick: built with --quick.
        keep_env: names of the user's NCCL_* / TORCH_NCCL_* variables that launches inherit (all
            others are left out, so that every variant, `default` included, measures only its
            own settings).
        nnodes: nodes the all-reduce cases span (each runs `devices` on every node; the copy
            probes stay on each node).
    """

    FILE: ClassVar[str] = "plan.json"

    backend: str
    devices: list[int]
    p2p: list[P2PCase] = field(default_factory=list)
    concurrent: list[ConcurrentCase] = field(default_factory=list)
    allreduce: list[AllReduceCase] = field(default_factory=list)
    timeout_s: float = 60.0
    quick: bool = False
    keep_env: list[str] = field(default_factory=list)
    nnodes: int = 1

    @property
    def nranks(self) -> int:
        """Ranks on this node (the devices)."""
        return len(self.devices)

    @property
    def stride(self) -> int:
        """Global GPU number = node rank * stride + device (pcieprof.bundle.nodes)."""
        return max(self.devices) + 1 if self.devices else 0

    def case_nodes(self, case: AllReduceCase) -> int:
        """Nodes one all-reduce case runs on."""
        return 1 if case.node0_only else self.nnodes

    def world(self, case: AllReduceCase) -> int:
        """Ranks of one all-reduce case over all its nodes (the rows' `nranks`)."""
        return len(case.ranks) * self.case_nodes(case)

    def global_ranks(self, case: AllReduceCase) -> tuple[int, ...]:
        """The rows' `ranks` of a case: global GPU numbers in global rank order (node 0's
        ranks first, each node's in the case's ring order); the devices on one node."""
        return tuple(n * self.stride + d for n in range(self.case_nodes(case)) for d in case.ranks)

    def copy_class(self, part: str, idx: int) -> str:
        """The class of copy case `idx` of `part` (`p2p` or `concurrent`) whose hangs stop the
        rest of it (pcieprof.probe_runner): the p2p path (`p2p`, `host_staged`, `h2d`, `d2h`: a
        broken peer path hangs every peer copy while host copies still run), or `concurrent`
        (every concurrent case is peer copies)."""
        return self.p2p[idx].path if part == "p2p" else "concurrent"

    def to_json(self) -> dict[str, Any]:
        """The plan as plan.json holds it, with what its readers would otherwise work out again:
        `nranks` the ranks over every node, `ranks_per_node`, `stride`, and per all-reduce case
        its `nranks` and `global_ranks` as its rows will say them (read back, they are dropped:
        the fields give them)."""
        d = super().to_json()
        d["nranks"] = self.nranks * self.nnodes
        d["ranks_per_node"] = self.nranks
        d["stride"] = self.stride
        for case, c in zip(self.allreduce, d["allreduce"]):
            c["nranks"], c["global_ranks"] = self.world(case), list(self.global_ranks(case))
        return d
