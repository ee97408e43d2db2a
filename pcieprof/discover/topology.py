"""topology.json for this machine: NVML (GPUs, pairs) + the OS side (PCIe tree, IOMMU, VM).

`discover()` reads the live machine (or a fake filesystem root and a replayed NVML snapshot in
tests); `assemble()` is the one place where the parts meet, shared with `from_logs`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from pcieprof.discover import pcie_tree, system
from pcieprof.discover.lspci import parse_lspci, run_lspci
from pcieprof.discover.nvml import Nvml, collect
from pcieprof.discover.nvml_snapshot import NvmlReplay
from pcieprof.discover.pci import PciDevice
from pcieprof.discover.sysfs import merge_lspci, read_sysfs_pci


def _os_gpu(index: int, node: dict[str, Any], parent: dict[str, Any] | None) -> dict[str, Any]:
    """A GPU record from the PCIe tree alone (NVML absent): what the OS can tell."""
    link = node.get("link") or {}
    plink = (parent or {}).get("link") or {}
    gen_dev = link.get("cap_gen")
    gen_sys = plink.get("cap_gen")
    gens = [g for g in (gen_dev, gen_sys) if g is not None]
    widths = [w for w in (link.get("cap_width"), plink.get("cap_width")) if w is not None]
    gpu: dict[str, Any] = {
        "index": index, "name": node.get("device"), "uuid": None, "bus_id": node["bdf"],
        "pcie": {"gen_current": link.get("gen"), "gen_max": min(gens) if gens else None,
                 "gen_max_device": gen_dev, "gen_max_system": gen_sys,
                 "width_current": link.get("width"), "width_max": min(widths) if widths else None,
                 "status": {}},
        "bar1_bytes": None, "memory_bytes": None, "numa_node": node.get("numa_node"),
        "gpu_numa_id": None, "cpu_affinity": None, "virtualization_mode": None,
        "status": {k: "unknown" for k in ("uuid", "bar1_bytes", "memory_bytes", "gpu_numa_id",
                                          "cpu_affinity", "virtualization_mode")},
    }
    for k, v in gpu["pcie"].items():
        if v is None:
            gpu["pcie"]["status"][k] = "unknown"
    if gpu["name"] is None:
        gpu["status"]["name"] = "unknown"
    if gpu["numa_node"] is None:
        gpu["status"]["numa_node"] = "unknown"
    return gpu


def _fill_from_os(gpu: dict[str, Any], node: dict[str, Any] | None,
                  parent: dict[str, Any] | None) -> None:
    """Add to an NVML GPU record what only the OS knows: host NUMA node, host-side max gen."""
    if node is None:
        return
    st = gpu.setdefault("status", {})
    if gpu.get("numa_node") is None and node.get("numa_node") is not None:
        gpu["numa_node"] = node["numa_node"]
        st.pop("numa_node", None)
    pcie = gpu.setdefault("pcie", {})
    gen_sys = ((parent or {}).get("link") or {}).get("cap_gen")
    if pcie.get("gen_max_system") is None and gen_sys is not None:
        pcie["gen_max_system"] = gen_sys
        pcie.get("status", {}).pop("gen_max_system", None)


def assemble(*, source: str, nvml_part: dict[str, Any] | None, devices: list[PciDevice] | None,
             iommu: dict[str, Any], virt: dict[str, Any], numa: dict[str, Any],
             status: dict[str, str], levels: dict[tuple[int, int], str] | None = None,
             level_source: str = "nvml") -> dict[str, Any]:
    """Join the NVML part and the OS part into one topology.json document.

    Args:
        source: "measured" or "imported".
        nvml_part: `nvml.collect()` output (or its equivalent from logs); None without NVML.
        devices: PCI records with parents; None when no OS view was had.
        iommu, virt, numa: `system.*` results.
        status: per-source status (`nvml`, `sysfs`, `lspci`, ...).
        levels: pairwise levels from another source (topo -m) when NVML gave none.
        level_source: label of where `pairs[].level` came from.
    """
    nvml_part = nvml_part or {"driver": {"driver_version": None, "cuda_driver_version": None,
                                         "nvml_version": None,
                                         "status": {"driver_version": "unknown",
                                                    "cuda_driver_version": "unknown",
                                                    "nvml_version": "unknown"}},
                              "gpus": [], "pairs": []}
    gpus = [dict(g) for g in nvml_part.get("gpus", [])]
    gpu_index = {g["index"]: g["bus_id"] for g in gpus if g.get("bus_id")}
    tree: dict[str, Any] = {"nodes": [], "gpu_paths": {}, "summary": {}}
    if devices:
        tree = pcie_tree.build_tree(devices, gpu_index or None)
    nodes = {n["bdf"]: n for n in tree["nodes"]}
    if not gpus:  # no NVML: the GPUs the PCI bus shows, in bus order
        for i, path in sorted(tree["gpu_paths"].items(), key=lambda kv: int(kv[0])):
            node = nodes[path[0]]
            gpus.append(_os_gpu(int(i), node, nodes.get(path[1]) if len(path) > 1 else None))
    for g in gpus:
        node = nodes.get(g.get("bus_id") or "")
        parent = nodes.get(node["parent"]) if node and node.get("parent") else None
        _fill_from_os(g, node, parent)

    numa_of = {g["index"]: g.get("numa_node") for g in gpus}
    pairs = [dict(p) for p in nvml_part.get("pairs", [])]
    src = level_source
    if not pairs and len(gpus) > 1:
        pairs = [{"a": a["index"], "b": b["index"], "level": None,
                  "p2p": {"read": None, "write": None, "atomics": None,
                          "status": {"read": "unknown", "write": "unknown", "atomics": "unknown"}},
                  "status": {}} for a in gpus for b in gpus if a["index"] != b["index"]]
        src = "pcie_tree"
    for p in pairs:
        p.setdefault("status", {})
        if levels and levels.get((p["a"], p["b"])):
            p["level"], p["level_source"] = levels[(p["a"], p["b"])], level_source
            p["status"].pop("level", None)
        elif p.get("level") is None and tree["gpu_paths"]:
            derived = pcie_tree.derive_level(tree, p["a"], p["b"], numa_of)
            p["level"], p["level_source"] = derived, "pcie_tree"
            if derived is None:
                p["status"]["level"] = "unknown"
            else:
                p["status"].pop("level", None)
        else:
            p["level_source"] = src if p.get("level") is not None else None

    iommu = dict(iommu)
    iommu["groups"] = {g["bus_id"]: nodes[g["bus_id"]]["iommu_group"] for g in gpus
                       if g.get("bus_id") in nodes and nodes[g["bus_id"]]["iommu_group"] is not None}
    grouped = [d.bdf for d in devices or [] if d.iommu_group is not None]
    if (iommu["groups"] or grouped) and iommu.get("enabled") is None:
        # only an active IOMMU driver makes groups; lspci prints them for any device
        iommu["enabled"] = True
        iommu["evidence"] = list(iommu.get("evidence", [])) + [
            "GPUs have IOMMU groups" if iommu["groups"] else
            f"lspci: {len(grouped)} devices have IOMMU groups (e.g. {grouped[0]})"]

    virt = dict(virt)
    evidence = list(virt.get("evidence", []))
    modes = {str(g["virtualization_mode"]) for g in gpus if g.get("virtualization_mode") is not None}
    for m in sorted(modes):
        evidence.append(f"GPU virtualization mode: {m}")
    if modes & {"passthrough", "vgpu"}:
        virt["is_vm"] = True
    # Ports QEMU emulates (pcie-root-port, pxb-pcie, pci-bridge) exist only in a guest: an lspci
    # of a VM says so even without lscpu or dmesg (tests/data/host_logs, the q35 guest).
    qemu = [d for d in devices or [] if d.is_bridge or d.class_code == 0x0600
            if "QEMU" in (d.device or "")]
    if qemu:
        evidence.append(f"lspci: {qemu[0].bdf} {qemu[0].device} (QEMU-emulated"
                        f"{f', and {len(qemu) - 1} more' if len(qemu) > 1 else ''})")
        if virt.get("is_vm") is None:
            virt["is_vm"] = True
            virt["hypervisor"] = virt.get("hypervisor") or "QEMU/KVM"
    flat = pcie_tree.is_flat(tree)
    paths = list(tree["gpu_paths"].values())
    if flat:
        roots = sorted({p[0].rsplit(":", 1)[0] for p in paths})
        evidence.append("every GPU sits directly on a root bus, no PCIe port above it (root bus"
                        f"{'es' if len(roots) > 1 else ''} {', '.join(roots)}): a flat "
                        "(virtual) PCIe tree")
    elif paths and virt.get("is_vm") and not any(
            nodes[b]["kind"] in ("switch_upstream", "switch_downstream") for p in paths for b in p):
        flat = True
        evidence.append("VM: no PCIe switch on any GPU path; the guest tree hides the real one")
    virt["flat_pcie_tree"] = flat
    virt["evidence"] = evidence

    return {"source": source, "driver": nvml_part["driver"], "gpus": gpus, "pairs": pairs,
            "pcie_tree": tree, "iommu": iommu, "virtualization": virt, "numa": numa,
            "status": status}


def _run_text(cmd: str) -> str | None:
    """Output of a read-only system command (lscpu, dmesg), None when it cannot run here
    (dmesg needs privileges on many systems)."""
    exe = shutil.which(cmd)
    if not exe:
        return None
    try:
        p = subprocess.run([exe], capture_output=True, text=True, timeout=10, check=False,
                           errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def discover(*, nvml: Any = None, root: str | Path = "/", use_lspci: bool = True) -> dict[str, Any]:
    """Discover the machine: the topology.json document of docs/bundle.md (source "measured").

    Never raises for a missing capability: no driver, no sysfs or no lspci each become a status.

    Args:
        nvml: an `Nvml` wrapper, a pynvml-like library (`NvmlReplay`), or a snapshot (dict or
            path to its JSON) to replay; None: the installed pynvml, when `root` is "/" (NVML
            describes this machine only, so with another root it is not consulted).
        root: filesystem root to read sysfs and /proc from.
        use_lspci: also run `lspci -vvv -D` (live root only) for what sysfs cannot read without
            root privileges (ACS bits, port types).
    """
    live = Path(root).resolve() == Path("/")
    status: dict[str, str] = {}
    if isinstance(nvml, (dict, str, Path)):
        nvml = NvmlReplay(nvml)
    if nvml is None and not live:
        nvml_part = None
        status["nvml"] = f"not_supported: NVML describes this machine, not root={root}"
    else:
        w = nvml if isinstance(nvml, Nvml) else Nvml(nvml)
        nvml_part = collect(w)
        status["nvml"] = nvml_part["status"]["nvml"]
        if w is not nvml:  # ours: leave NVML as we found it
            w.shutdown()

    devices, status["sysfs"] = read_sysfs_pci(root)
    status["lspci"] = "not_supported: not run" if not (use_lspci and live) else ""
    if use_lspci and live:
        text, st = run_lspci()
        status["lspci"] = st
        if text:
            try:
                lspci_devices = parse_lspci(text, source="lspci -vvv -D")
            except Exception as e:  # noqa: BLE001 - an odd lspci must not stop discovery
                status["lspci"] = f"error: {e}"
            else:
                if devices:
                    merge_lspci(devices, lspci_devices)
                else:
                    devices = lspci_devices
    lscpu = _run_text("lscpu") if live else None
    dmesg = _run_text("dmesg") if live else None
    return assemble(source="measured", nvml_part=nvml_part, devices=devices,
                    iommu=system.iommu_state(root, dmesg=dmesg),
                    virt=system.hypervisor_state(root, lscpu=lscpu, dmesg=dmesg),
                    numa=system.numa_nodes(root), status=status)
