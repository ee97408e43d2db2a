"""topology.json from the text logs of a machine (`pcieprof import` of machine logs).

Same document as `topology.discover()`, with `source: "imported"`: lspci -vvv gives the PCIe tree
and ACS bits, nvidia-smi -q the GPUs, topo -m the pairwise levels and CPU affinity, and
/proc/cmdline, dmesg, lscpu and `numactl -H` the IOMMU, hypervisor and NUMA state.
"""

from __future__ import annotations

from typing import Any, Mapping

from pcieprof.discover import system
from pcieprof.discover.lspci import parse_lspci
from pcieprof.discover.lspci_tree import MISSING as TREE_MISSING
from pcieprof.discover.lspci_tree import parse_lspci_tree
from pcieprof.discover.smi_query import parse_smi_query
from pcieprof.discover.topo_matrix import PCIE_ONLY_VIEW, parse_topo_matrix
from pcieprof.discover.topology import assemble
from pcieprof.errors import BadInput

_GPU_KEYS = ("index", "name", "uuid", "bus_id", "pcie", "bar1_bytes", "memory_bytes",
             "virtualization_mode")


def _gpus_from_smi(q: dict[str, Any], t: dict[str, Any] | None) -> list[dict[str, Any]]:
    gpus = []
    for g in q["gpus"]:
        rec = {k: g[k] for k in _GPU_KEYS}
        rec["pcie"] = {k: g["pcie"][k] for k in ("gen_current", "gen_max", "gen_max_device",
                                                 "gen_max_system", "width_current", "width_max")}
        rec["pcie"]["status"] = {k: "unknown" for k, v in rec["pcie"].items() if v is None}
        i = g["index"]
        rec["numa_node"] = t["numa_affinity"].get(i) if t else None
        rec["gpu_numa_id"] = t["gpu_numa_id"].get(i) if t else None
        rec["cpu_affinity"] = t["cpu_affinity"].get(i) if t else None
        rec["status"] = {k: "unknown" for k in ("name", "uuid", "bus_id", "bar1_bytes",
                                                "memory_bytes", "virtualization_mode",
                                                "numa_node", "gpu_numa_id", "cpu_affinity")
                         if rec.get(k) is None}
        if t and rec["gpu_numa_id"] is None:
            rec["status"]["gpu_numa_id"] = "not_supported"  # topo -m prints N/A
        gpus.append(rec)
    return gpus


def topology_from_logs(*, lspci: str | None = None, lspci_tree: str | None = None,
                       smi_q: str | None = None,
                       topo_m: str | None = None, cmdline: str | None = None,
                       numa: str | None = None, lscpu: str | None = None,
                       dmesg: str | None = None,
                       names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Build topology.json (source "imported") from the texts of one machine's logs.

    Args:
        lspci: `lspci -vvv` output; lspci_tree: `lspci -tv` (used when there is no lspci -vvv:
            the tree without NUMA node, link or ACS); smi_q: `nvidia-smi -q`;
        topo_m: `nvidia-smi topo -m`;
        cmdline: /proc/cmdline; numa: `numactl -H`; lscpu: `lscpu`; dmesg: `dmesg`.
        names: file name per argument (e.g. {"lspci": "lspci_full.log"}) for error messages.

    Returns:
        The topology.json document; parts without a log are null/empty with status "unknown".

    Raises:
        BadInput: a given text cannot be parsed (naming the file and line), or the logs disagree
            on the GPUs (a different count or bus ids).
    """
    names = dict(names or {})
    status: dict[str, str] = {}
    devices = None
    if lspci is not None:
        devices = parse_lspci(lspci, source=names.get("lspci", "lspci -vvv"))
        status["lspci"] = "ok"
    elif lspci_tree is not None:
        devices = parse_lspci_tree(lspci_tree, source=names.get("lspci_tree", "lspci -tv"))
        status["lspci"] = f"ok: lspci -tv, the tree only ({TREE_MISSING}: sudo lspci -vvv has them)"
    else:
        status["lspci"] = "unknown: no lspci -vvv log"
    t = parse_topo_matrix(topo_m, source=names.get("topo_m", "nvidia-smi topo -m")) \
        if topo_m is not None else None
    status["topo_m"] = "ok" if t else "unknown: no nvidia-smi topo -m log"
    pcie_only = bool(t and t["view"] == "pcie_only")
    if pcie_only:
        # topo -mp prints an NVLink pair's PCIe level: its matrix cannot say there is no NVLink.
        status["nvlink"] = f"unknown: {PCIE_ONLY_VIEW}"
    nvml_part: dict[str, Any] | None = None
    if smi_q is not None:
        q = parse_smi_query(smi_q, source=names.get("smi_q", "nvidia-smi -q"))
        status["smi_q"] = "ok"
        if t and t["gpus"] != len(q["gpus"]):
            raise BadInput(f"{names.get('topo_m', 'topo -m')} shows {t['gpus']} GPUs but "
                           f"{names.get('smi_q', 'nvidia-smi -q')} {len(q['gpus'])}",
                           hint="import logs of one machine together")
        driver = {"driver_version": q["driver_version"], "cuda_driver_version": q["cuda_version"],
                  "nvml_version": None, "status": {"nvml_version": "unknown"}}
        for k in ("driver_version", "cuda_driver_version"):
            if driver[k] is None:
                driver["status"][k] = "unknown"
        nvml_part = {"driver": driver, "gpus": _gpus_from_smi(q, t), "pairs": []}
    else:
        status["smi_q"] = "unknown: no nvidia-smi -q log"
    if devices is not None and nvml_part is not None:
        pci_name = names.get("lspci", names.get("lspci_tree", "lspci -vvv"))
        pci_gpus = {d.bdf for d in devices if d.is_nvidia_gpu}
        missing = [g["bus_id"] for g in nvml_part["gpus"] if g["bus_id"] not in pci_gpus]
        if missing:
            raise BadInput(f"GPUs {', '.join(missing)} of {names.get('smi_q', 'nvidia-smi -q')} "
                           f"are not in {pci_name}",
                           hint="import logs of one machine together")
    levels = None
    if t:
        levels = {(p["a"], p["b"]): p["level"] for p in t["pairs"]}
    status["nvml"] = "not_supported: imported logs"
    doc = assemble(source="imported", nvml_part=nvml_part, devices=devices,
                   iommu=system.iommu_state(None, cmdline=cmdline, dmesg=dmesg),
                   virt=system.hypervisor_state(None, lscpu=lscpu, dmesg=dmesg),
                   numa=system.numa_nodes(None, numa=numa, lscpu=lscpu), status=status,
                   levels=levels, level_source="topo -mp" if pcie_only else "topo -m")
    if t and nvml_part is None:
        # GPUs only from lspci: the topo -m affinity still belongs to them (same index order)
        for g in doc["gpus"]:
            g["cpu_affinity"] = t["cpu_affinity"].get(g["index"])
            g["status"].pop("cpu_affinity", None)
    return doc
