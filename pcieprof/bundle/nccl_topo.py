"""nccl_topo*.json: an NCCL topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE) as pcieprof read
it. The importer (pcieprof.importers.nccl_xml.parse_topo_xml) builds it; the import merges its
GPUs and NUMA nodes into topology.json. Attribute names are NCCL's own (src/graph/xml.cc);
numbers NCCL writes as text (link_speed "16.0 GT/s PCIe") stay text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pcieprof.bundle.document import Document


@dataclass
class TopoCpu:
    """A `<cpu>`: one NUMA node; `cpus` is `affinity` (NCCL's hex mask) as a list like `0-23`."""

    numaid: int
    affinity: str | None = None
    cpus: str | None = None
    arch: str | None = None
    vendor: str | None = None
    familyid: int | None = None
    modelid: int | None = None


@dataclass
class TopoPci:
    """A `<pci>` node; `parent` is the bus id above it (None under a CPU); `class_` is stored as
    `class`."""

    busid: str
    parent: str | None = None
    numaid: int | None = None
    class_: str | None = None
    vendor: str | None = None
    device: str | None = None
    link_speed: str | None = None
    link_width: int | None = None


@dataclass
class NvLink:
    """An `<nvlink>` of a GPU: its peer's bus id, the link count and the peer's PCI class."""

    target: str | None = None
    count: int | None = None
    tclass: str | None = None


@dataclass
class TopoGpu:
    """A `<gpu>`; `dev` is the CUDA device index; `pci_path` the bus ids from it up to its CPU."""

    dev: int
    rank: int | None = None
    sm: int | None = None
    gdr: int | None = None
    busid: str | None = None
    numaid: int | None = None
    pci_path: list[str] = field(default_factory=list)
    nvlinks: list[NvLink] = field(default_factory=list)


@dataclass
class TopoNic:
    """A `<net>` (under a `<nic>`); speed in Mb/s as NCCL writes it."""

    dev: int
    name: str | None = None
    guid: str | None = None
    speed: int | None = None
    port: int | None = None
    maxconn: int | None = None
    gdr: int | None = None
    latency: float | None = None
    busid: str | None = None
    numaid: int | None = None


@dataclass
class PciGpu:
    """A PCI device of a display class (0x0300/0x0302), whether or not a `<gpu>` is under it (a
    cloud's file may place GPUs by class alone)."""

    busid: str
    numaid: int | None = None
    pci_path: list[str] = field(default_factory=list)


@dataclass
class PciNic:
    """A PCI device of a NIC class (Ethernet 0x0200, InfiniBand 0x0207); stored as `class`."""

    busid: str
    numaid: int | None = None
    class_: str = ""


@dataclass
class VirtualTree:
    """Whether the file describes a VM's flat virtual PCI tree (None: no GPU to judge), and why."""

    flat: bool | None = None
    evidence: list[str] = field(default_factory=list)


@dataclass
class NcclTopo(Document):
    """One topology file; `source_file` is where the bundle keeps the original bytes (set by the
    import's writer)."""

    FILE: ClassVar[str] = "nccl_topo.json"
    FORMAT: ClassVar[str] = "pcieprof.nccl_topo"

    version: int = 1
    cpus: list[TopoCpu] = field(default_factory=list)
    pci: list[TopoPci] = field(default_factory=list)
    gpus: list[TopoGpu] = field(default_factory=list)
    nics: list[TopoNic] = field(default_factory=list)
    pci_gpus: list[PciGpu] = field(default_factory=list)
    pci_nics: list[PciNic] = field(default_factory=list)
    virtual_tree: VirtualTree = field(default_factory=VirtualTree)
    source_file: str | None = None
