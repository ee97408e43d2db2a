"""topology.json for an import: from the machine logs (the discovery parsers of pcieprof.discover), or a
skeleton of docs/bundle.md filled with what the tool outputs say (GPUs, topo -m levels, topo -p2p
statuses, NCCL topology XML).

Unknown fields stay null with a `status` entry saying `unknown`, as the bundle contract asks.
"""

from __future__ import annotations

import copy
from typing import Any

from pcieprof.bundle.topology import Iommu, Topology, Virtualization
from pcieprof.discover.from_logs import topology_from_logs
from pcieprof.importers.records import GpuRecord

_PCIE_KEYS = ("gen_current", "gen_max", "gen_max_device", "gen_max_system", "width_current",
              "width_max")
_GPU_FIELDS = ("uuid", "bar1_bytes", "memory_bytes", "numa_node", "cpu_affinity")


def skeleton(why: str = "imported: not in the given files") -> dict[str, Any]:
    """An empty topology.json (pcieprof.bundle.topology) with every unknown marked."""
    return Topology(source="imported", iommu=Iommu(status={"enabled": "unknown"}),
                    virtualization=Virtualization(status={"is_vm": "unknown"}),
                    status={k: f"not_supported: {why}" for k in ("nvml", "sysfs", "lspci")}
                    ).to_json()


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


def merge_nccl_topo(topo: dict[str, Any], doc: dict[str, Any], source: str) -> None:
    """GPU bus ids and NUMA nodes from an NCCL topology XML (dev = CUDA device index)."""
    cpus = {c["numaid"]: c for c in doc["cpus"]}
    for gx in doc["gpus"]:
        g = ensure_gpu(topo, gx["dev"])
        _set(g, "bus_id", gx["busid"])
        _set(g, "numa_node", gx["numaid"])
        cpu = cpus.get(gx["numaid"])
        if cpu:
            _set(g, "cpu_affinity", cpu["cpus"])
    nodes = {n["id"] for n in topo["numa"]["nodes"]}
    for c in doc["cpus"]:
        if c["numaid"] not in nodes:
            topo["numa"]["nodes"].append({"id": c["numaid"], "cpus": c["cpus"]})
    topo["numa"]["nodes"].sort(key=lambda n: n["id"])
    topo.setdefault("evidence", []).append(
        f"{source}: NCCL topology XML; GPU dev numbers are CUDA device indices")


def from_machine_logs(logs: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """topology.json from the machine logs given, through the discovery parsers.

    Args:
        logs: {format: (file name, text)} for `nvidia-smi-q`, `lspci`, `nvidia-smi-topo-m`,
            `numactl`, `lscpu`, `cmdline`, `dmesg`.

    Returns:
        The topology dict (docs/bundle.md), `source` set to `imported`.

    Raises:
        BadInput: from the parsers (one line with file and line).
    """
    kwargs_of = {"lspci": "lspci", "nvidia-smi-q": "smi_q", "nvidia-smi-topo-m": "topo_m",
                 "cmdline": "cmdline", "numactl": "numa", "lscpu": "lscpu", "dmesg": "dmesg"}

    kwargs = {kwargs_of[f]: text for f, (_n, text) in logs.items()}
    names = {kwargs_of[f]: n for f, (n, _t) in logs.items()}
    topo = copy.deepcopy(topology_from_logs(**kwargs, names=names))
    topo["source"] = "imported"
    return topo


