"""topology.json: what the machine is (GPUs, pairwise levels, PCIe tree, IOMMU, virtualization).

One builder for every producer (discovery, the import of machine logs, the fabric model, a
failed discovery): construct a `Topology` and write `to_json()`. Unknown values are None and the
object holding them has a `status` map {field: "not_supported" | "error: <why>" | "unknown"}.
The field list is docs/bundle.md's; keys a producer adds beyond it stay in `extra`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcieprof.bundle.document import Document


#: ACS control bits that send peer-to-peer requests / completions up to the root complex.
ACS_P2P_REDIRECT = ("ReqRedir", "CmpltRedir")


def acs_redirect(node: dict[str, Any]) -> list[str]:
    """The ACS_P2P_REDIRECT bits set in a PCIe tree node's ACS control."""
    ctl = (node.get("acs") or {}).get("ctl") or {}
    return [b for b in ACS_P2P_REDIRECT if ctl.get(b)]


#: nvidia-smi / NVML P2P status code -> what it means for the pair: `ok`, `not_supported` (CNS
#: chipset, GNS GPU, TNS topology not supported, NS not supported, DR disabled by regkey: no P2P
#: of that kind on that pair), `unknown` (U). The codes are nvidia-smi's legend (`topo -p2p`).
P2P_CODE_STATUS = {"OK": "ok", "CNS": "not_supported", "GNS": "not_supported",
                   "TNS": "not_supported", "NS": "not_supported", "DR": "not_supported",
                   "U": "unknown"}

#: Pair.p2p keys that say whether peer copies can run (`topo -p2p r|w|rw|p`, NVML read/write).
#: Atomics and NVLink do not: a pair without either still copies over PCIe.
P2P_COPY_CAPS = ("read", "write", "pcie")


@dataclass
class Gpu:
    """One GPU. Indices are NVML / nvidia-smi indices (PCI bus order).

    Attributes:
        index: NVML index.
        name, uuid, bus_id: as NVML reports them (bus id `0000:01:00.0`).
        pcie: {gen_current, gen_max, gen_max_device, gen_max_system, width_current, width_max}.
        bar1_bytes, memory_bytes: bytes.
        numa_node: the host NUMA node next to the GPU.
        cpu_affinity: CPUs near the GPU (`0-63`).
        virtualization_mode: bare_metal | passthrough | vgpu | host_vgpu | host_vsga | none | unknown.
        status: why a field is None.
    """

    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    pcie: dict[str, Any] = field(default_factory=dict)
    bar1_bytes: int | None = None
    memory_bytes: int | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    virtualization_mode: str | None = None
    status: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Pair:
    """An ordered GPU pair: its nvidia-smi topo -m level and NVML's P2P status.

    Attributes:
        a, b: GPU indices.
        level: X | PIX | PXB | PHB | NODE | SYS | NV#, or None when unknown.
        p2p: {read, write, atomics}: OK | CNS | GNS | TNS | NS | DR | U.
        level_source: nvml | topo -m | topo -mp (PCIe paths only, NVLink hidden) | pcie_tree.
        status: why a field is None.
    """

    a: int
    b: int
    level: str | None = None
    p2p: dict[str, Any] = field(default_factory=dict)
    level_source: str | None = None
    status: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def p2p_state(self) -> str | None:
        """What NVML / `nvidia-smi topo -p2p` says of peer copies on this pair: `ok` when a copy
        capability (read, write, pcie) is OK, `not_supported` when every one given is not
        supported, `unknown` otherwise; None when none was reported."""
        codes = [str(self.p2p[k]) for k in P2P_COPY_CAPS if self.p2p.get(k)]
        if not codes:
            return None
        states = {P2P_CODE_STATUS.get(c, "unknown") for c in codes}
        if "ok" in states:
            return "ok"
        return "not_supported" if states == {"not_supported"} else "unknown"


@dataclass
class Iommu:
    """IOMMU state: `mode` translated | passthrough | off | unknown; groups by bus id."""

    enabled: bool | None = None
    mode: str = "unknown"
    cmdline: str | None = None
    groups: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def translating(self) -> bool:
        """True when the IOMMU translates peer DMA (on and not passthrough/off)."""
        return self.mode == "translated" or bool(self.enabled and self.mode not in
                                                  ("passthrough", "off"))


@dataclass
class Virtualization:
    """Whether this is a VM, its hypervisor, and whether the guest sees a flat PCIe tree."""

    is_vm: bool | None = None
    hypervisor: str | None = None
    flat_pcie_tree: bool | None = None
    evidence: list[str] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Topology(Document):
    """topology.json.

    Attributes:
        source: measured | simulated | imported.
        driver: {driver_version, cuda_driver_version, nvml_version, status}.
        gpus: the GPUs, by index.
        pairs: ordered pairs a != b.
        pcie_tree: {nodes: [...], gpu_paths: {gpu index: [gpu bdf, parent, ..., root port]},
            summary}; see docs/bundle.md for a node's fields.
        iommu, virtualization: host state with the evidence lines it came from.
        numa: {nodes: [{id, cpus}]}.
        status: per source (nvml, sysfs, lspci, topo_m, smi_q, discovery).
        sim: the fabric model's truth behind a simulated guest view (real tree and pairs).
    """

    FILE = "topology.json"
    FORMAT = "pcieprof.topology"
    VERSION = 1

    source: str = "measured"
    driver: dict[str, Any] = field(default_factory=lambda: {
        "driver_version": None, "cuda_driver_version": None, "nvml_version": None,
        "status": {"driver_version": "unknown", "cuda_driver_version": "unknown",
                   "nvml_version": "unknown"}})
    gpus: list[Gpu] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    pcie_tree: dict[str, Any] = field(default_factory=lambda: {"nodes": [], "gpu_paths": {}})
    iommu: Iommu = field(default_factory=Iommu)
    virtualization: Virtualization = field(default_factory=Virtualization)
    numa: dict[str, Any] = field(default_factory=lambda: {"nodes": []})
    status: dict[str, Any] = field(default_factory=dict)
    sim: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def levels(self) -> dict[tuple[int, int], str]:
        """(a, b) -> level for both orders of every pair with a known level."""
        out: dict[tuple[int, int], str] = {}
        for p in self.pairs:
            if p.level is not None:
                out[(p.a, p.b)] = out[(p.b, p.a)] = str(p.level)
        return out

    def tree_nodes(self) -> list[dict[str, Any]]:
        return list((self.pcie_tree or {}).get("nodes") or [])

    def acs_redirect_bridges(self) -> list[str]:
        """Bridges whose ACS control redirects P2P up to the root complex."""
        return [str(n["bdf"]) for n in self.tree_nodes() if acs_redirect(n)]

    def has_nvlink(self) -> bool:
        return any(str(p.level or "").startswith("NV") for p in self.pairs)

    def nvlink_hidden(self) -> bool:
        """True when the levels come from a view without NVLink (`nvidia-smi topo -mp`) and no
        pair shows NV#: "no NVLink pair" cannot be read from them."""
        return not self.has_nvlink() and (
            str(self.status.get("nvlink", "")).startswith("unknown")
            or any(p.level_source == "topo -mp" for p in self.pairs))
