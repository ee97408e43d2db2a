"""A multi-node bundle in words: the layout ("2 nodes x 8 GPUs"), which all-reduce groups cross
nodes, and how the all-reduce crossed them (NCCL's inter-node transport, from its log).

The layout is the manifest's `nodes` (pcieprof.bundle.nodes). NCCL says which network it took
in its NCCL_DEBUG=INFO log, which pcieprof.importers.nccl_log parses: `Using network IB` or
`Using network Socket` per communicator (the net plugin NCCL chose), and per peer link
`Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/0/GDRDMA` (NET transport, device index, and
`GDRDMA` when GPUDirect RDMA is used), next to `P2P/...` and `SHM/...` for the links inside a
node (NVIDIA/nccl src/transport/net.cc, src/init.cc). On the cpu backend the collectives are
gloo's (TCP between processes), not NCCL's, and are said to be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclCase, NcclChoices
from pcieprof.bundle.nodes import NodeLayout


def internode_transport(choices: NcclChoices | None, layout: NodeLayout, backend: str) -> str:
    """How the cross-node all-reduce went between the nodes: `Socket (NET/Socket/0)`, `IB
    (NET/IB/0/GDRDMA)`, `gloo over TCP (cpu backend: NCCL not used)`, or why it is unknown."""
    if backend == "cpu":
        return "gloo over TCP (cpu backend: NCCL not used)"
    cases = [c for c in (choices.cases.values() if choices else [])
             if c.parsed is not None and layout.spans_nodes(c.ranks)]
    cases.sort(key=lambda c: (c.variant != "default", bool(c.env)))
    for case in cases:
        said = _net_of(case)
        if said:
            return said
    return "not in the NCCL logs (no parsed log of a cross-node case)"


def _net_of(case: NcclCase) -> str | None:
    parsed = case.parsed
    if parsed is None:
        return None
    vias = sorted({str(v) for v in parsed.transports if str(v).upper().startswith("NET")})
    nets = sorted({c.network for c in parsed.comms if c.network})
    if not vias and not nets:
        return None
    if nets:
        name = ", ".join(nets)
    else:  # NET/<plugin>/<device>[/...]
        parts = vias[0].split("/")
        name = parts[1] if len(parts) > 1 else vias[0]
    return f"{name} ({', '.join(vias)})" if vias else f"{name} (network NCCL chose)"


@dataclass
class Nodes:
    """What a report or the tuner says about a multi-node bundle.

    Attributes:
        layout: the manifest's nodes.
        backend: the bundle's backend (GPUs or processes).
        transport: NCCL's inter-node transport (or gloo's), in words.
    """

    layout: NodeLayout
    backend: str
    transport: str

    @classmethod
    def of(cls, bundle: Bundle) -> "Nodes | None":
        """The nodes of a multi-node bundle, None for a one-node bundle."""
        layout = bundle.nodes()
        if layout is None:
            return None
        return cls(layout, bundle.backend,
                   internode_transport(bundle.read_doc(NcclChoices), layout, bundle.backend))

    def describe(self) -> str:
        """`2 nodes x 8 GPUs`."""
        return self.layout.describe(self.backend)

    def scope(self, ranks: Iterable[int]) -> str:
        """`inter-node` or `intra-node` for a group (global GPU numbers)."""
        return self.layout.scope(ranks)

    def group(self, ranks: Iterable[int]) -> str:
        """A group in words: `2 nodes x 8 GPUs (16 ranks, inter-node)`, or `8 GPUs of node 0
        (intra-node)`."""
        ranks = list(ranks)

        def unit(n: int) -> str:
            return ("process" if n == 1 else "processes") if self.backend == "cpu" else \
                ("GPU" if n == 1 else "GPUs")
        if self.layout.spans_nodes(ranks):
            nodes = {self.layout.node_of(r) for r in ranks}
            per = len(ranks) // max(1, len(nodes))
            return f"{len(nodes)} nodes x {per} {unit(per)} ({len(ranks)} ranks, inter-node)"
        node = self.layout.node_of(ranks[0]) if ranks else 0
        return f"{len(ranks)} {unit(len(ranks))} of node {node} (intra-node)"

    def facts(self) -> list[tuple[str, str]]:
        """The layout as (name, value) pairs: nodes, hosts and bundles, where the collective
        rows are, the inter-node transport."""
        lay = self.layout
        out = [("layout", f"{self.describe()}; this bundle is node {lay.node_rank} of "
                          f"{lay.nnodes}")]
        if lay.rdzv_endpoint:
            out.append(("rendezvous", str(lay.rdzv_endpoint)))
        for n in lay.nodes:
            out.append((f"node {n.node_rank}", f"host {n.host}, devices "
                        f"{','.join(map(str, n.devices))} = global "
                        f"{','.join(map(str, n.gpus))}, bundle {n.bundle}"))
        out.append(("collective rows", "this bundle (allreduce.csv, nccl_choices.json)"
                    if lay.node_rank == 0 else str(lay.collective_rows)))
        out.append(("inter-node transport", self.transport))
        return out

    def lines(self) -> list[str]:
        """`facts()` as `name: value` lines."""
        return [f"{k}: {v}" for k, v in self.facts()]
