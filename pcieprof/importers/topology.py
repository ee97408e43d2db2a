"""topology.json for an import: from the machine logs (the discovery parsers of pcieprof.discover), or a
skeleton of docs/bundle.md filled with what the tool outputs say (GPUs, topo -m levels, topo -p2p
statuses, NCCL topology XML).

Unknown fields stay null with a `status` entry saying `unknown`, as the bundle contract asks.
"""

from __future__ import annotations

import copy
from typing import Any

from pcieprof.bundle.nccl_topo import NcclTopo
from pcieprof.bundle.topology import Iommu, Topology, Virtualization
from pcieprof.discover.from_logs import topology_from_logs
from pcieprof.importers.records import GpuRecord, Parsed

_PCIE_KEYS = ("gen_current", "gen_max", "gen_max_device", "gen_max_system", "width_current",
              "width_max")
_GPU_FIELDS = ("uuid", "bar1_bytes", "memory_bytes", "numa_node", "cpu_affinity")


def skeleton(why: str = "imported: not in the given files") -> dict[str, Any]:
    """An empty topology.json (pcieprof.bundle.topology) with every unknown marked."""
    return Topology(source="imported", iommu=Iommu(status={"enabled": "unknown"}),
                    virtualization=Virtualization(status={"is_vm": "unknown"}),
                    status={k: f"not_supported: {why}" for k in ("nvml", "sysfs", "lspci")}
                    ).to_json()


def flat_tree_evidence(bus_ids: list[str | None], name: str) -> list[str]:
    """Evidence of a VM's flat virtual PCI tree in the GPUs' bus ids, or [] when there is none.

    A discrete GPU on bus 00 sits on a root bus with no PCIe port above it, which real hardware
    never builds (a GPU is behind a root port or a switch, on a bus > 0): a hypervisor's virtual
    PCI does (QEMU's root bus; Hyper-V and Azure give each GPU a PCI domain of its own).
    """
    ids = [b for b in bus_ids if b]
    if len(ids) < 1 or len(ids) != len(bus_ids):
        return []
    buses = [b.split(":") for b in ids]
    if any(len(p) != 3 or int(p[1], 16) != 0 for p in buses):
        return []
    domains = sorted({p[0] for p in buses})
    where = (f"each in a PCI domain of its own ({', '.join(domains)})" if len(domains) == len(ids)
             and len(ids) > 1 else f"in PCI domain{'s' if len(domains) > 1 else ''} "
             + ", ".join(domains))
    return [f"{name}: every GPU ({len(ids)}) sits on bus 00, {where}: no PCIe port above any "
            "GPU, a hypervisor's flat virtual PCI tree (real hardware puts a GPU behind a root "
            "port or switch)"]


def _gpu(index: int) -> dict[str, Any]:
    return {"index": index, "name": None, "uuid": None, "bus_id": None,
            "pcie": {k: None for k in _PCIE_KEYS}, "bar1_bytes": None, "memory_bytes": None,
            "numa_node": None, "cpu_affinity": None, "virtualization_mode": "unknown",
            "status": {**{k: "unknown" for k in ("name", "bus_id") + _GPU_FIELDS},
                       "pcie": "unknown"}}


def ensure_gpu(topo: dict[str, Any], index: int) -> dict[str, Any]:
    """The GPU entry with `index`, added (all unknown) when missing."""
    for g in topo["gpus"]:
        if g.get("index") == index:
            return g
    g = _gpu(index)
    topo["gpus"].append(g)
    topo["gpus"].sort(key=lambda x: x["index"])
    return g


def _set(gpu: dict[str, Any], key: str, value: Any) -> None:
    if value is None or gpu.get(key) is not None:
        return
    gpu[key] = value
    gpu.setdefault("status", {}).pop(key, None)


def add_gpus(topo: dict[str, Any], gpus: list[GpuRecord], source: str) -> list[str]:
    """Fill GPU names and bus ids from a tool's device list; returns disagreements found."""
    problems = []
    for rec in gpus:
        g = ensure_gpu(topo, rec.index)
        if rec.bus_id and g.get("bus_id") and g["bus_id"].lower() != rec.bus_id.lower():
            problems.append(f"{source}: GPU {rec.index} bus id {rec.bus_id} differs from "
                            f"{g['bus_id']}")
        _set(g, "name", rec.name)
        _set(g, "bus_id", rec.bus_id)
    return problems


def ensure_pair(topo: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    """The pair (a, b) entry, added with unknown level and P2P status when missing."""
    for p in topo["pairs"]:
        if p.get("a") == a and p.get("b") == b:
            p.setdefault("p2p", {"read": None, "write": None, "atomics": None})
            return p
    p = {"a": a, "b": b, "level": None, "p2p": {"read": None, "write": None, "atomics": None},
         "status": {"level": "unknown", "p2p": "unknown"}}
    topo["pairs"].append(p)
    topo["pairs"].sort(key=lambda x: (x["a"], x["b"]))
    return p


def merge_topo_m(topo: dict[str, Any], parsed: dict[str, Any]) -> None:
    """Levels, CPU and NUMA affinity of `nvidia-smi topo -m` (pcieprof.discover.topo_matrix.parse_topo_matrix result)."""
    for p in parsed["pairs"]:
        pair = ensure_pair(topo, p["a"], p["b"])
        if pair.get("level") is None:
            pair["level"] = p["level"]
            pair["level_source"] = "topo -mp" if parsed.get("view") == "pcie_only" else "topo -m"
            pair.get("status", {}).pop("level", None)
    for idx, aff in parsed.get("cpu_affinity", {}).items():
        g = ensure_gpu(topo, int(idx))
        _set(g, "cpu_affinity", aff)
    for idx, node in parsed.get("numa_affinity", {}).items():
        g = ensure_gpu(topo, int(idx))
        _set(g, "numa_node", node)


def merge_p2p_status(topo: dict[str, Any], pair_p2p: dict[tuple[int, int], dict[str, str]]
                     ) -> None:
    """P2P status codes of `nvidia-smi topo -p2p` into the pairs."""
    for (a, b), caps in pair_p2p.items():
        ensure_gpu(topo, a)
        ensure_gpu(topo, b)
        pair = ensure_pair(topo, a, b)
        for cap, code in caps.items():
            pair["p2p"][cap] = code
            if isinstance(pair["p2p"].get("status"), dict):
                pair["p2p"]["status"].pop(cap, None)
        if all(pair["p2p"].get(k) is not None for k in ("read", "write", "atomics")):
            pair.get("status", {}).pop("p2p", None)


def merge_nccl_topo(topo: dict[str, Any], doc: NcclTopo, source: str) -> None:
    """GPU bus ids and NUMA nodes from an NCCL topology XML (dev = CUDA device index)."""
    cpus = {c.numaid: c for c in doc.cpus}
    for gx in doc.gpus:
        g = ensure_gpu(topo, gx.dev)
        _set(g, "bus_id", gx.busid)
        numa = gx.numaid if gx.numaid is not None and gx.numaid >= 0 else None
        _set(g, "numa_node", numa)  # numaid="-1": NCCL had no NUMA node for it
        cpu = cpus.get(gx.numaid) if gx.numaid is not None else None
        if cpu:
            _set(g, "cpu_affinity", cpu.cpus)
    nodes = {n["id"] for n in topo["numa"]["nodes"]}
    for c in doc.cpus:
        if c.numaid not in nodes and c.numaid >= 0:
            topo["numa"]["nodes"].append({"id": c.numaid, "cpus": c.cpus})
    topo["numa"]["nodes"].sort(key=lambda n: n["id"])
    topo.setdefault("evidence", []).append(
        f"{source}: NCCL topology XML; GPU dev numbers are CUDA device indices")


def merge_driver(topo: dict[str, Any], facts: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The driver version a tool printed (nvbandwidth's `Driver Version`) into topology.json's
    `driver` where the machine logs left it unknown; returns disagreements between files.

    Args:
        topo: the topology dict being built.
        facts: (file name, Parsed.facts) of every imported file.
    """
    driver = topo.setdefault("driver", {})
    seen: dict[str, str] = {}
    for name, f in facts:
        version = f.get("driver_version")
        if version:
            seen.setdefault(str(version), name)
    if not seen:
        return []
    have = driver.get("driver_version")
    if have is None:
        first = next(iter(seen))
        driver["driver_version"] = first
        driver.get("status", {}).pop("driver_version", None)
        driver.setdefault("source", {})["driver_version"] = seen[first]
        have = first
    return [f"{name}: driver {v} differs from {have} (one bundle holds one machine state)"
            for v, name in seen.items() if v != have]


def note_flat_tree(topo: dict[str, Any], evidence: list[str], *, flat: bool) -> None:
    """Add evidence about a flat virtual PCI tree to `virtualization`; `flat` marks it found (and
    the machine a VM, unless something said otherwise: only a hypervisor builds such a tree)."""
    virt = topo.setdefault("virtualization", {})
    seen = virt.setdefault("evidence", [])
    seen += [e for e in evidence if e not in seen]
    if flat:
        virt["flat_pcie_tree"] = True
        virt.get("status", {}).pop("flat_pcie_tree", None)
        if virt.get("is_vm") is None:
            virt["is_vm"] = True
            virt.get("status", {}).pop("is_vm", None)
            seen.append("is_vm: a flat virtual PCI tree is built by a hypervisor")


def merge_virtualization(topo: dict[str, Any], parsed: list[Parsed]) -> None:
    """Recognise a VM's flat virtual PCI tree from whatever was imported, with the evidence.

    Decisive: the GPUs' bus ids (from any file: nvidia-smi -q, NCCL XML, p2pBandwidthLatencyTest,
    nccl-tests) all on bus 00 (`flat_tree_evidence`), an NCCL topology dump whose GPUs have no
    bridge and no PCIe link, lspci (decided by discovery). `nvidia-smi topo -m` can only say that
    no GPU pair is below a switch or bridge: a flat tree when the machine is known to be a VM,
    only a note otherwise (a board with one root port per GPU looks the same).
    """
    hints: list[str] = []
    for p in parsed:
        if p.facts.get("flat_pcie_tree"):
            note_flat_tree(topo, p.facts["flat_pcie_tree"], flat=True)
        nccl_topo = p.documents.get("nccl_topo")
        if isinstance(nccl_topo, NcclTopo) and nccl_topo.virtual_tree.evidence:
            vt = nccl_topo.virtual_tree
            note_flat_tree(topo, vt.evidence, flat=bool(vt.flat))
        hint = p.documents.get("topo_m", {}).get("flat_evidence")
        if hint:
            hints.append(f"{p.name}: {hint}")
    virt = topo.setdefault("virtualization", {})
    buses = [g.get("bus_id") for g in topo.get("gpus", [])]
    if buses and virt.get("flat_pcie_tree") is not True:
        bus00 = flat_tree_evidence(buses, "GPU bus ids")
        if bus00:
            note_flat_tree(topo, bus00, flat=True)
    if hints and virt.get("flat_pcie_tree") is not True:
        if virt.get("is_vm"):
            note_flat_tree(topo, [h + "; in a VM: a flat virtual tree" for h in hints], flat=True)
        else:
            note_flat_tree(topo, [h + "; a flat tree if this is a VM, or one root port per GPU "
                                  "on bare metal (not decided from topo -m alone)" for h in hints],
                           flat=False)


def from_machine_logs(logs: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """topology.json from the machine logs given, through the discovery parsers.

    Args:
        logs: {format: (file name, text)} for `nvidia-smi-q`, `lspci`, `lspci-tree`,
            `nvidia-smi-topo-m`, `numactl`, `lscpu`, `cmdline`, `dmesg`.

    Returns:
        The topology dict (docs/bundle.md), `source` set to `imported`.

    Raises:
        BadInput: from the parsers (one line with file and line).
    """
    kwargs_of = {"lspci": "lspci", "lspci-tree": "lspci_tree", "nvidia-smi-q": "smi_q",
                 "nvidia-smi-topo-m": "topo_m",
                 "cmdline": "cmdline", "numactl": "numa", "lscpu": "lscpu", "dmesg": "dmesg"}

    kwargs = {kwargs_of[f]: text for f, (_n, text) in logs.items()}
    names = {kwargs_of[f]: n for f, (n, _t) in logs.items()}
    topo = copy.deepcopy(topology_from_logs(**kwargs, names=names))
    topo["source"] = "imported"
    return topo


