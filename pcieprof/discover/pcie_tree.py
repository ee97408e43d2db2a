"""Build the `pcie_tree` of topology.json from PciDevice records (lspci or sysfs alike).

Kinds: root_port, switch_upstream, switch_downstream, bridge, gpu, endpoint. The PCIe port type
from the Express capability decides; where it is unknown (sysfs without a readable config space)
the kind is inferred from the shape of the tree and the node says `kind_inferred: true`.
"""

from __future__ import annotations

from typing import Any

from pcieprof.discover.pci import PciDevice, gen_of_speed

_KIND_OF_PORT = {"root_port": "root_port", "upstream": "switch_upstream",
                 "downstream": "switch_downstream"}


def _kinds(devices: dict[str, PciDevice]) -> dict[str, tuple[str, bool]]:
    """bdf -> (kind, inferred)."""
    children: dict[str, list[str]] = {}
    for d in devices.values():
        if d.parent:
            children.setdefault(d.parent, []).append(d.bdf)
    out: dict[str, tuple[str, bool]] = {}
    for d in devices.values():
        if d.is_nvidia_gpu:
            out[d.bdf] = ("gpu", False)
        elif d.port_type in _KIND_OF_PORT:
            out[d.bdf] = (_KIND_OF_PORT[d.port_type], False)
        elif d.is_bridge:
            out[d.bdf] = ("bridge", d.port_type is None)
        else:
            out[d.bdf] = ("endpoint", False)

    # Bridges of unknown port type: a top-level one is a root port; below it, a bridge with
    # bridge children is a switch upstream port and its child bridges are downstream ports.
    def infer(bdf: str) -> None:
        d = devices[bdf]
        kind, inferred = out[bdf]
        if kind == "bridge" and inferred:
            parent_kind = out[d.parent][0] if d.parent in out else None
            if d.parent is None:
                out[bdf] = ("root_port", True)
            elif parent_kind == "switch_upstream":
                out[bdf] = ("switch_downstream", True)
            elif any(out[c][0] in ("bridge", "switch_downstream") for c in children.get(bdf, [])):
                out[bdf] = ("switch_upstream", True)
        for c in children.get(bdf, []):
            infer(c)

    for d in devices.values():
        if d.parent is None or d.parent not in devices:
            infer(d.bdf)
    return out


def _link(d: PciDevice) -> dict[str, Any] | None:
    if d.speed_gts is None and d.width is None and d.cap_speed_gts is None and d.cap_width is None:
        return None
    return {"speed_gts": d.speed_gts, "width": d.width, "cap_speed_gts": d.cap_speed_gts,
            "cap_width": d.cap_width, "gen": gen_of_speed(d.speed_gts),
            "cap_gen": gen_of_speed(d.cap_speed_gts), "downgraded": d.downgraded}


def gpu_order(devices: list[PciDevice]) -> list[str]:
    """NVIDIA GPUs in PCI bus order, which is the order of nvidia-smi/NVML indices by default."""
    return sorted(d.bdf for d in devices if d.is_nvidia_gpu)


def build_tree(devices: list[PciDevice], gpu_index: dict[int, str] | None = None,
               *, all_devices: bool = False) -> dict[str, Any]:
    """The `pcie_tree` object of topology.json.

    Args:
        devices: records with `parent` set (lspci.assign_parents or the sysfs reader).
        gpu_index: NVML index -> bdf; default: the GPUs in PCI bus order.
        all_devices: keep every function; by default only bridges/ports, GPUs, endpoints that
            share a switch with a GPU, and network controllers (which GPUDirect traffic may cross).

    Returns:
        {"nodes": [...], "gpu_paths": {"<index>": [gpu bdf, ..., root port bdf]}, "summary": {...}}.
    """
    by_bdf = {d.bdf: d for d in devices}
    kinds = _kinds(by_bdf)
    if gpu_index is None:
        gpu_index = dict(enumerate(gpu_order(devices)))

    def path_up(bdf: str) -> list[str]:
        path, seen = [bdf], {bdf}
        while (p := by_bdf[path[-1]].parent) is not None and p in by_bdf and p not in seen:
            path.append(p)
            seen.add(p)
        return path

    gpu_paths = {str(i): path_up(b) for i, b in sorted(gpu_index.items()) if b in by_bdf}
    switch_parents = {by_bdf[b].parent for p in gpu_paths.values() for b in p
                      if kinds[b][0] == "switch_downstream"}
    keep: set[str] = set()
    for d in devices:
        kind = kinds[d.bdf][0]
        if all_devices or kind != "endpoint":
            keep.add(d.bdf)
        elif d.class_code is not None and (d.class_code >> 8) == 0x02:
            keep.add(d.bdf)
        elif d.parent and by_bdf.get(d.parent) and by_bdf[d.parent].parent in switch_parents:
            keep.add(d.bdf)
    for p in gpu_paths.values():
        keep.update(p)
    for d in devices:  # keep the ancestors of whatever is kept, so the tree stays connected
        if d.bdf in keep:
            keep.update(path_up(d.bdf))

    nodes = []
    for d in devices:
        if d.bdf not in keep:
            continue
        kind, inferred = kinds[d.bdf]
        if d.class_code == 0x0600 and kind == "endpoint" and not all_devices:
            continue  # host bridges are not PCIe hops
        node: dict[str, Any] = {
            "bdf": d.bdf, "parent": d.parent if d.parent in by_bdf else None, "kind": kind,
            "vendor": d.vendor or d.vendor_id, "device": d.device or d.device_id,
            "vendor_id": d.vendor_id, "device_id": d.device_id, "description": d.description,
            "port_type": d.port_type, "numa_node": d.numa_node, "iommu_group": d.iommu_group,
            "driver": d.driver, "link": _link(d),
            "acs": ({"cap": d.acs_cap, "ctl": d.acs_ctl}
                    if d.acs_cap is not None or d.acs_ctl is not None else None),
        }
        if inferred:
            node["kind_inferred"] = True
        nodes.append(node)
    kept = {n["bdf"] for n in nodes}
    for n in nodes:  # a parent dropped above (a host bridge) is not part of the tree
        if n["parent"] not in kept:
            n["parent"] = None

    def on_paths(kind: str) -> list[str]:
        return sorted({b for p in gpu_paths.values() for b in p if kinds[b][0] == kind})

    # ACS request/completion redirect on a GPU path sends P2P up to the root complex (and
    # through the IOMMU when it translates) instead of across the switch.
    redirect = sorted({b for p in gpu_paths.values() for b in p
                       if (by_bdf[b].acs_ctl or {}).get("ReqRedir")
                       or (by_bdf[b].acs_ctl or {}).get("CmpltRedir")})
    summary = {"gpus": len(gpu_paths), "root_ports": on_paths("root_port"),
               "switch_upstream": on_paths("switch_upstream"),
               "switch_downstream": on_paths("switch_downstream"),
               "bridges": on_paths("bridge"), "acs_redirect_on_gpu_paths": redirect}
    return {"nodes": nodes, "gpu_paths": gpu_paths, "summary": summary}


def is_flat(tree: dict[str, Any]) -> bool | None:
    """True when every GPU sits directly on a root bus with no bridge above it (a VM's flat
    virtual tree: QEMU's root bus, or a PCI domain per GPU as Hyper-V/Azure give); None when
    there are no GPUs. Real hardware always puts a root port or a switch above a GPU."""
    paths = list(tree.get("gpu_paths", {}).values())
    if not paths:
        return None
    return all(len(p) == 1 for p in paths)


def _switch_of(bdf: str, nodes: dict[str, dict[str, Any]]) -> str:
    """The switch a port belongs to (its upstream port's bdf); any other bridge is its own."""
    n = nodes[bdf]
    if n["kind"] == "switch_downstream" and n["parent"] in nodes:
        return n["parent"]
    return bdf


def derive_level(tree: dict[str, Any], a: int, b: int, numa: dict[int, int | None]) -> str | None:
    """The `nvidia-smi topo -m` level of GPUs a and b, worked out from the PCIe tree.

    Rules (NVML's level names): below one switch, or one bridge -> PIX; below a common bridge
    through several switches/bridges -> PXB; no common bridge but the same root bus (host bridge)
    -> PHB; different host bridges in one NUMA node -> NODE; different NUMA nodes -> SYS. The
    ports of one switch count as one bridge, which is how NVML reports two GPUs on one
    Broadcom switch (PIX). None when NUMA nodes are needed and unknown.
    """
    nodes = {n["bdf"]: n for n in tree["nodes"]}
    pa, pb = tree["gpu_paths"].get(str(a)), tree["gpu_paths"].get(str(b))
    if not pa or not pb:
        return None
    if a == b:
        return "X"
    up_b = pb[1:]
    common = next((x for x in pa[1:] if x in up_b), None)
    if common is not None:
        hops = pa[1:pa.index(common)] + up_b[:up_b.index(common)] + [common]
        switches = {_switch_of(h, nodes) for h in hops if h in nodes}
        return "PIX" if len(switches) <= 1 else "PXB"
    root_bus_a, root_bus_b = pa[-1].rsplit(":", 1)[0], pb[-1].rsplit(":", 1)[0]
    if root_bus_a == root_bus_b:
        return "PHB"
    na, nb = numa.get(a), numa.get(b)
    if na is None or nb is None:
        return None
    return "NODE" if na == nb else "SYS"
