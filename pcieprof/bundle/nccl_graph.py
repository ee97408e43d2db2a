"""nccl_graph*.json: an NCCL graph XML (NCCL_GRAPH_FILE / NCCL_GRAPH_DUMP_FILE) as pcieprof read
it. The importer (pcieprof.importers.nccl_xml.parse_graph_xml) builds it and checks what NCCL
would refuse; the probes read the ring graph NCCL dumped through it (probes.nccl_graph).
Attribute names are NCCL's own (src/graph/xml.cc, `ncclTopoGetXmlGraphFromFile`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pcieprof.bundle.document import Document


@dataclass
class GraphChannel:
    """One `<channel>`: the devices in the order NCCL walks them."""

    gpus: list[int] = field(default_factory=list)
    nets: list[int] = field(default_factory=list)


@dataclass
class Graph:
    """One `<graph>`.

    Attributes:
        pattern: NCCL's number (src/include/graph.h: 4 ring, 3 tree, ...); `pattern_name` says it.
        speedintra, speedinter: GB/s as NCCL means them.
        latencyinter: microseconds, 0.0 when the file has none.
        typeintra, typeinter: NCCL path types (LOC, NVL, PIX, PXB, PHB, SYS, ...).
        samechannels: 1 when every channel is the same ring.
    """

    id: int
    pattern: int
    crossnic: int
    nchannels: int
    samechannels: int
    speedintra: float
    speedinter: float
    latencyinter: float = 0.0
    typeintra: str = ""
    typeinter: str = ""
    pattern_name: str = "unknown"
    channels: list[GraphChannel] = field(default_factory=list)


@dataclass
class NcclGraph(Document):
    """The graphs of one file; `source_file` is where the bundle keeps the original bytes (set by
    the import's writer)."""

    FILE: ClassVar[str] = "nccl_graph.json"
    FORMAT: ClassVar[str] = "pcieprof.nccl_graph"

    version: int = 1
    graphs: list[Graph] = field(default_factory=list)
    source_file: str | None = None
