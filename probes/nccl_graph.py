"""Applying a ring order to NCCL, and proving from NCCL's own log which ring it used.

Why not a CUDA_VISIBLE_DEVICES permutation (NVIDIA/nccl, src/graph/, 2.2x as of 2.28):
- `search.cc` `ncclTopoSearchRec` searches over the topology's GPU nodes, not over ranks: for one
  node it first tries "PCI order" (`FORCED_ORDER_PCI`: GPU node 0, 1, 2, ...), then every other
  order (`ncclTopoSearchNextGpuSort`, ties kept in node-index order); `ncclTopoCompareGraphs`
  replaces a found ring only by one with more bandwidth or fewer hops. Only at the end does
  `ncclTopoSearchRecGpu` write ranks into the ring (`graph->intra[...] = gpu->gpu.rank`), and
  `rings.cc` `ncclBuildRings` prints that ring in rank space ("Channel 00/02 : 0 1 2 3").
- The node order comes from the topology XML (`topo.cc` `ncclTopoGetSystemFromXml` ->
  `ncclTopoAddCpu` -> `ncclTopoAddPci`, depth first). `xml.cc` `ncclTopoGetXmlFromSys` keeps the
  PCI children of a bridge sorted by bus id (its "Keep PCI sub devices ordered by PCI Bus ID").
  Each rank detects only its own GPU and the ranks' XMLs are fused in local-rank order
  (`topo.cc` `ncclTopoGetSystem`; `xml.cc` `ncclTopoFuseXml` appends subtrees it has not seen),
  so a permutation can reorder GPUs that hang off one parent (a flat virtual tree), while GPUs
  stay grouped under their switch and CPU, and any other order with more bandwidth or fewer hops
  still wins the search.
So a permutation relabels ranks, and moves the physical ring at most among equals: on a box with
switches the ring NCCL builds for 0,2,1,3 is 0,1,2,3 in GPU terms. The way
NCCL takes a ring as given is `NCCL_GRAPH_FILE` (`search.cc` `ncclTopoCompute`: a graph loaded
from the file is used as it is, "Search 0 : N channels loaded from XML graph"; its `<gpu dev>` is
the NVML index, `ncclTopoGetChannelFromXml`).

What the runner does with a ring order on cuda: CUDA_VISIBLE_DEVICES in PCI order (rank r drives
the r-th GPU of the group), a graph file whose channels are the requested ring, and, after the
launch, the ring NCCL printed mapped back to GPUs through the `nvmlDev` of each rank's init line:
the order is `applied` only when every channel is the requested ring (either direction).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import quoteattr

from pcieprof.bundle.nccl_choices import NcclParsed
from pcieprof.importers.nccl_xml import parse_graph_xml
from pcieprof.schema import nccl_dev

RING_PATTERN = 4  # NCCL_TOPO_PATTERN_RING (src/include/graph.h)


@dataclass(frozen=True)
class GraphHeader:
    """The attributes of an NCCL ring graph other than its channels.

    Attributes:
        nchannels: channels (each one copy of the ring).
        speedintra: per-channel bandwidth NCCL plans with inside the node, GB/s.
        speedinter: the same between nodes, GB/s.
        typeintra: the farthest path type the ring uses (PIX, PXB, PHB, SYS, ...).
        typeinter: the same between nodes.
        samechannels: 1 when every channel is the same ring.
        source: where the values came from (NCCL's own graph of the plain order, or assumed).
    """

    nchannels: int = 2
    speedintra: float = 12.0
    speedinter: float = 12.0
    typeintra: str = "SYS"
    typeinter: str = "PIX"
    samechannels: int = 1
    source: str = ("assumed: 2 channels at 12 GB/s, path type SYS (no graph NCCL dumped for "
                   "these GPUs)")


def header_from_dump(text: str, name: str) -> GraphHeader:
    """The ring graph's attributes from a file NCCL wrote (NCCL_GRAPH_DUMP_FILE), so a forced ring
    runs with the channel count and speeds NCCL chose for the plain order of the same GPUs.

    Raises:
        BadInput: not a graph file NCCL would read.
        ValueError: the file has no ring graph.
    """
    doc = parse_graph_xml(text, name)
    # NCCL loads graph id 0 from a graph file as the ring graph (search.cc: each graph of the
    # file is matched by id); a 2.2x dump lists all five graphs, the tree's pattern is not 4
    for g in doc.graphs:
        if g.id == 0 and g.pattern == RING_PATTERN and g.nchannels > 0:
            return GraphHeader(g.nchannels, g.speedintra, g.speedinter, g.typeintra, g.typeinter,
                               1, f"NCCL's own ring graph ({name})")
    raise ValueError(f"{name}: no ring graph (id 0, pattern {RING_PATTERN}, with channels)")


def ring_graph_xml(order: list[int], header: GraphHeader = GraphHeader()) -> str:
    """NCCL_GRAPH_FILE text: graph id 0 (the ring graph) with `header.nchannels` channels, each the
    ring `order` (NVML device indices, written "0x.." as NCCL 2.2x writes them: `nccl_dev`)."""
    head = " ".join(f"{k}={quoteattr(str(v))}" for k, v in (
        ("id", 0), ("pattern", RING_PATTERN), ("crossnic", 0), ("nchannels", header.nchannels),
        ("speedintra", f"{header.speedintra:g}"), ("speedinter", f"{header.speedinter:g}"),
        ("latencyinter", 0), ("typeintra", header.typeintra), ("typeinter", header.typeinter),
        ("samechannels", header.samechannels)))
    lines = ['<graphs version="1">', f"  <graph {head}>"]
    for _ in range(header.nchannels):
        lines.append("    <channel>")
        lines += [f"      <gpu dev={quoteattr(nccl_dev(g))}/>" for g in order]
        lines.append("    </channel>")
    lines += ["  </graph>", "</graphs>", ""]
    return "\n".join(lines)


def same_ring(a: list[int], b: list[int]) -> bool:
    """Whether two rings are the same cycle (any rotation, either direction)."""
    if len(a) != len(b) or sorted(a) != sorted(b):
        return False
    if not a:
        return True
    k = a.index(b[0])
    rot = a[k:] + a[:k]
    return rot == b or [rot[0], *reversed(rot[1:])] == b


def rings_in_gpus(parsed: NcclParsed, rank_to_device: Mapping[Any, int]
                  ) -> tuple[list[list[int]], str]:
    """The rings of a parsed NCCL log (pcieprof.importers.nccl_log) in GPU indices, and how ranks
    were mapped: through each rank's `nvmlDev` from its init line when the log has them all,
    else through `rank_to_device` ({rank: GPU}, the launch's CUDA_VISIBLE_DEVICES)."""
    by_rank = {int(r): int(d) for r, d in rank_to_device.items()}
    rings = [list(map(int, r)) for r in parsed.rings.values()]
    comms = [c for c in parsed.comms if c.nranks == parsed.nranks]
    nvml: dict[int, int] = {}
    for c in comms[:1]:
        for r, info in c.ranks.items():
            if info.nvml_dev is not None:
                nvml[int(r)] = info.nvml_dev
    ranks = {r for ring in rings for r in ring}
    if ranks and ranks <= set(nvml):
        return [[nvml[r] for r in ring] for ring in rings], "nvmlDev of each rank's init line"
    return ([[by_rank[r] for r in ring if r in by_rank] for ring in rings],
            "the launch's CUDA_VISIBLE_DEVICES (no nvmlDev for every rank in the log)")


def check_ring(parsed: NcclParsed | None, order: list[int],
               rank_to_device: Mapping[Any, int]) -> dict[str, Any]:
    """Did NCCL run the ring `order` (GPU indices)? From its log's `Channel NN/MM : r r r` lines.

    Returns:
        {"requested": order, "used": [ring per channel, GPU indices], "mapped_by": how,
        "applied": bool, "why": one line}.
    """
    out: dict[str, Any] = {"requested": list(order), "used": [], "mapped_by": None,
                           "applied": False}
    if parsed is None or not parsed.rings:
        out["why"] = "the NCCL log has no ring lines (NCCL_DEBUG=INFO with INIT)"
        return out
    used, how = rings_in_gpus(parsed, rank_to_device)
    out.update(used=used, mapped_by=how)
    bad = [r for r in used if not same_ring(r, order)]
    if bad:
        out["why"] = (f"NCCL used {' '.join(map(str, bad[0]))} on {len(bad)} of {len(used)} "
                      f"channel(s), not the requested {' '.join(map(str, order))}")
    else:
        out.update(applied=True, why=f"all {len(used)} channel(s) run the requested ring")
    return out


def not_ring_sizes(parsed: NcclParsed | None, sizes: list[int]) -> dict[int, str]:
    """The message sizes (bytes) at which NCCL's tuner chose an all-reduce algorithm other than
    the ring, from a TUNING log ({size: algorithms, e.g. "TREE"}). A graph file sets the ring
    graph (id 0) only: the tree graph is searched as usual and stays enabled, so at these sizes
    a requested ring order is not what ran. TUNING lines carry bytes, not dtype: the dtypes of
    one byte count are merged (any non-ring choice counts)."""
    seen: dict[int, set[str]] = {}
    for t in parsed.tuner if parsed is not None else []:
        if t.get("coll") in (None, "AllReduce") and int(t.get("bytes") or -1) in sizes:
            seen.setdefault(int(t["bytes"]), set()).add(str(t.get("algo")).upper())
    # the old numeric form names the ring 1 (NCCL_ALGO_RING in nccl_common.h: TREE 0, RING 1)
    return {s: ",".join(sorted(a)) for s, a in sorted(seen.items())
            if a - {"RING", "1"}}
