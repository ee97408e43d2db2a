"""The nodes of a multi-node run, as the manifest's `nodes` key records them (docs/bundle.md).

`pcieprof topology --nnodes N --node-rank R --rdzv-endpoint HOST:PORT` writes one bundle per
node. Node 0's bundle holds every collective row (allreduce.csv, nccl_choices.json); each node's
bundle holds its own discovery and copy probes, and the others' manifests say where the
collective rows are (`collective_rows`).

Numbering: the ranks of a collective across nodes are numbered as global GPUs,
`node_rank * stride + device` (stride: one more than the highest device index of the run, the
same on every node), in global rank order: node 0's ranks first. On one node that is the device
index itself, so `allreduce.csv`'s `ranks` means the same thing in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class NodeInfo:
    """One node of the run.

    Attributes:
        node_rank: its rank (node 0 hosts the rendezvous and holds global rank 0).
        host: its host name.
        pid: the pcieprof process that ran there.
        bundle: its bundle directory, as a path on that host.
        devices: the devices (GPU indices, or cpu ranks) it ran the probes on.
        gpus: their global numbers (node_rank * stride + device).
    """

    node_rank: int
    host: str | None = None
    pid: int | None = None
    bundle: str | None = None
    devices: list[int] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)


@dataclass
class NodeLayout:
    """The manifest's `nodes`: how this bundle's node sits among the others.

    Attributes:
        nnodes: number of nodes.
        node_rank: this bundle's node.
        rdzv_endpoint: HOST:PORT where node 0 listened for the others.
        rdzv_timeout_s: how long a node was given to join (seconds).
        stride: global GPU number = node_rank * stride + device.
        nodes: every node that joined, by rank (empty when the run never got that far).
        collective_rows: where this run's collective rows are: "this bundle" on node 0, else
            `host:path` of node 0's bundle.
    """

    nnodes: int
    node_rank: int
    rdzv_endpoint: str | None = None
    rdzv_timeout_s: float | None = None
    stride: int = 0
    nodes: list[NodeInfo] = field(default_factory=list)
    collective_rows: str | None = None

    @property
    def per_node(self) -> int:
        """Devices per node (this node's count when the others are not known)."""
        mine = next((n for n in self.nodes if n.node_rank == self.node_rank), None)
        return len(mine.devices) if mine else 0

    def describe(self, backend: str = "cuda") -> str:
        """`2 nodes x 8 GPUs` (`processes` on the cpu backend)."""
        n = self.per_node
        unit = ("process" if n == 1 else "processes") if backend == "cpu" else \
            ("GPU" if n == 1 else "GPUs")
        return f"{self.nnodes} nodes x {n or '?'} {unit}"

    def node_of(self, gpu: int) -> int | None:
        """The node of a global GPU number (None without a stride)."""
        return gpu // self.stride if self.stride > 0 else None

    def spans_nodes(self, ranks: Iterable[int]) -> bool:
        """True when a group of global GPU numbers lies on more than one node."""
        return len({self.node_of(int(r)) for r in ranks}) > 1

    def scope(self, ranks: Iterable[int]) -> str:
        """`inter-node` or `intra-node` for a group of global GPU numbers."""
        return "inter-node" if self.spans_nodes(ranks) else "intra-node"
