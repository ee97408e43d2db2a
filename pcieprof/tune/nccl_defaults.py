"""What NCCL does by default on a box whose GPU pairs cross a host bridge (PHB, NODE, SYS).

NVIDIA/nccl src/graph/paths.cc @04cdb808, ncclTopoCheckP2p: "By default don't use P2P across CPU
Host Bridges and further apart" (`p2pLevel = PATH_PXB`), then "Allow P2P between pairs of GPU
devices on AMD systems" (x86, vendor AMD, at most two GPUs: `PATH_SYS`); NCCL_P2P_LEVEL /
NCCL_P2P_DISABLE override both. A pair NCCL refuses P2P runs through host memory (its SHM
transport). Older releases had another default (P2P at every distance except on ARM and Intel
CPUs, whose level was PXB, e.g. paths.cc of the 2.18 era), so a log of the actual run
(nccl_choices.json) is the word on what one release chose.

Which CPU the box has is in no file pcieprof reads by default, so the note states both cases.
"""

from __future__ import annotations

from pcieprof.bundle.topology import Topology

SOURCE = "NVIDIA/nccl src/graph/paths.cc @04cdb808 (ncclTopoCheckP2p)"
#: nvidia-smi levels whose path crosses a CPU host bridge: beyond NCCL's default P2P level (PXB).
HOST_LEVELS = ("PHB", "NODE", "SYS")


def host_pairs(topology: Topology) -> list[tuple[int, int, str]]:
    """(a, b, level) of every GPU pair (a < b) whose topology level crosses a host bridge."""
    return sorted((a, b, lv) for (a, b), lv in topology.levels().items()
                  if a < b and lv in HOST_LEVELS)


def all_phb_note(topology: Topology) -> str | None:
    """A sentence when every GPU pair is PHB: no pair is within NCCL's default P2P level, so all
    of them use SHM. That flat picture is what a VM's virtual tree shows whatever the real
    switches are; it is also real bare metal on boards whose GPUs all hang off one host bridge
    (the 5-GPU Proxmox host of ../shared/samples/tool-outputs, one NUMA node, all PHB), so the
    levels alone do not say VM: the bus ids, NCCL's topology dump or lspci decide that."""
    levels = {lv for (a, b), lv in topology.levels().items() if a != b}
    gpus = {g for pair in topology.levels() for g in pair}
    if levels != {"PHB"} or len(gpus) < 2:
        return None
    return (f"all {len(gpus)} GPUs PHB, none within PXB; in a VM that is the flat virtual tree, "
            "whatever switches the real GPUs share (a P2P bandwidth measurement tells)")


def p2p_default_note(topology: Topology) -> str | None:
    """What NCCL does by default with this box's host-bridge pairs, or None when it has none.

    Args:
        topology: topology.json (its pair levels).

    Returns:
        One evidence line naming the pairs, NCCL's default and its AMD exception, with the source.
    """
    pairs = host_pairs(topology)
    if not pairs:
        return None
    ngpus = len({g for a, b, _ in pairs for g in (a, b)} | {g.index for g in topology.gpus})
    shown = ", ".join(f"{a}-{b} {lv}" for a, b, lv in pairs[:6]) + (
        f" and {len(pairs) - 6} more" if len(pairs) > 6 else "")
    amd = ("with two GPUs on an AMD CPU NCCL uses P2P on them anyway" if ngpus <= 2 else
           f"its AMD exception (P2P at every distance) covers two GPUs only, not these {ngpus}")
    vm = all_phb_note(topology)
    return (f"{SOURCE}: by default NCCL uses P2P only up to PXB, so {len(pairs)} pair(s) here "
            f"({shown}) go through host memory (its SHM transport) unless NCCL_P2P_LEVEL=SYS; "
            f"{amd}" + (f"; {vm}" if vm else ""))


def cpu_vendor(topology: Topology) -> str | None:
    """`amd` or `intel` from the root ports' vendor in the PCIe tree (lspci names the CPU's own
    root ports: "Advanced Micro Devices, Inc. [AMD]"), None when the tree does not tell."""
    vendors = {str(n.get("vendor") or "").lower() for n in topology.tree_nodes()
               if n.get("kind") == "root_port"}
    if any("amd" in v or "advanced micro" in v for v in vendors):
        return "amd"
    if any("intel" in v for v in vendors):
        return "intel"
    return None


def two_rank_note(topology: Topology) -> str | None:
    """What NCCL does by default in a communicator of two GPUs (a TP2 group) on an AMD CPU: P2P
    at every distance, since the count in paths.cc is of the communicator's GPUs (its topology
    holds only the GPUs of its ranks). None on an Intel host; stated as conditional when the
    CPU is not known."""
    vendor = cpu_vendor(topology)
    if vendor == "intel":
        return None
    where = "on this AMD host" if vendor == "amd" else "if the host CPU is AMD (not in this bundle)"
    text = (f"{SOURCE}: a 2-GPU communicator {where} uses P2P at every distance by default "
            "(the AMD exception counts the communicator's GPUs), so the TP2 groups take the "
            "P2P path with no NCCL_P2P_LEVEL set")
    if topology.iommu.translating:
        text += ("; here that path runs through the translating IOMMU: the P2P hang risk applies "
                 "without any setting (check with pcieprof recommend --verify, or "
                 "NCCL_P2P_DISABLE=1)")
    return text
