"""Write the files NCCL reads: NCCL_GRAPH_FILE (a fixed ring) and NCCL_TOPO_FILE (the real tree).

Formats as NCCL itself reads them (NVIDIA/nccl src/graph/search.cc ncclTopoGetGraphFromXmlSub and
ncclTopoGetChannelFromXml; src/graph/xml.cc ncclTopoGetXmlFromGpu), matching the files NCCL dumps
and clouds ship (../shared/samples/tool-outputs/nccl_graph_azure_ncv4_4xA100pcie_vm.xml):

- graph: `<graphs version="1"><graph id pattern crossnic nchannels speedintra speedinter
  latencyinter typeintra typeinter samechannels><channel><gpu dev=.../>...`. id 0 is the ring graph
  and pattern 4 is NCCL_TOPO_PATTERN_RING (src/include/graph.h). Graphs a file does not list are
  searched by NCCL as usual. `dev` is the NVML device index (ncclTopoGetXmlFromGpu sets it from
  nvmlDeviceGetIndex); NCCL 2.2x writes it as `%#lx` and parses it with strtol(..., 16), older
  releases with strtol base 0, so it is written as "0x.." (`pcieprof.schema.nccl_dev`), which
  both read alike.
- topo: `<system version="1"><cpu numaid=...><pci busid class link_speed link_width>` nested for
  switches (class 0x060400), a GPU's pci node (class 0x03...) holding `<gpu dev=.../>`, `dev` in
  decimal: topo.cc reads it with xmlGetAttrInt (strtol base 0, where a bare "a" is 0). NCCL fills
  every attribute left out (sm, rank, gdr, CPU affinity/arch/vendor) from the running system
  (the "if unset" branches of ncclTopoGetXmlFromGpu / ncclTopoGetXmlFromCpu), so only what the VM
  hides is written: which GPUs share a switch and which CPU (NUMA node) each switch hangs off.
  In a VM the link speed is left out too (`_link_attrs`: the guest's maximum generation can be
  its virtual root port's).
  Only from a tree pcieprof has seen (`host_tree`: a simulated VM's host tree, or the user's
  `lspci -vvv` of the host given to `recommend --host-lspci`), never one inferred from bandwidth
  levels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from xml.sax.saxutils import quoteattr

from pcieprof.analysis.infer import InferredTopology
from pcieprof.bundle import Bundle
from pcieprof.bundle.host_tree import HostPcieTree
from pcieprof.bundle.topology import Gpu, Topology
from pcieprof.schema import NCCL_PATH_TYPES, nccl_dev
from pcieprof.tune.ring import Ring

#: Where `pcieprof recommend` writes the files inside the bundle.
GRAPH_FILE = "tune/nccl_graph.xml"
TOPO_FILE = "tune/nccl_topo.xml"

RING_PATTERN = 4  # NCCL_TOPO_PATTERN_RING
_PCI_GEN_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe",
                  4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}


def _attrs(**kv: Any) -> str:
    return " ".join(f"{k}={quoteattr(str(v))}" for k, v in kv.items())


def link_type(a: int, b: int, inferred: InferredTopology | None) -> str:
    """NCCL path type of the link a-b from the inferred levels (nvidia-smi's NODE is written as
    PHB: NCCL has no NODE path type, see pcieprof.schema.NCCL_PATH_TYPES)."""
    if inferred is None:
        return "SYS"
    lv = inferred.levels[inferred.pair_level.get((a, b), len(inferred.levels) - 1)].smi_level
    if lv.startswith("NV"):
        return "NVL"
    return "PHB" if lv == "NODE" else lv if lv in NCCL_PATH_TYPES else "SYS"


def graph_xml(ring: Ring, *, nchannels: int = 2, inferred: InferredTopology | None = None,
              speed_gbps: float | None = None) -> str:
    """The NCCL_GRAPH_FILE text for one ring, its channels alternating forward and reversed.

    Args:
        ring: the ring (GPU indices = NVML indices).
        nchannels: ring channels to list (NCCL may still duplicate them, and NCCL_MIN_NCHANNELS
            raises the count).
        inferred: the inferred topology, for the worst link type on the ring (typeintra).
        speed_gbps: per-channel bandwidth to declare (speedintra, GB/s); default the ring's
            bottleneck divided over the channels.
    """
    nchannels = max(1, int(nchannels))
    worst = "PIX"
    for a, b, _, _ in ring.links:
        t = link_type(a, b, inferred)
        if NCCL_PATH_TYPES.index(t) > NCCL_PATH_TYPES.index(worst):
            worst = t
    speed = speed_gbps if speed_gbps is not None else ring.bottleneck_gbps / nchannels
    head = _attrs(id=0, pattern=RING_PATTERN, crossnic=0, nchannels=nchannels,
                  speedintra=f"{speed:.4g}", speedinter=f"{speed:.4g}", latencyinter=0,
                  typeintra=worst, typeinter="PIX", samechannels=0)
    lines = ['<graphs version="1">', f"  <graph {head}>"]
    fwd = list(ring.order)
    rev = [fwd[0], *reversed(fwd[1:])]
    for c in range(nchannels):
        lines.append("    <channel>")
        for g in (fwd if c % 2 == 0 else rev):
            lines.append(f"      <gpu {_attrs(dev=nccl_dev(g))}/>")
        lines.append("    </channel>")
    lines += ["  </graph>", "</graphs>", ""]
    return "\n".join(lines)


def _link_attrs(gpu: Gpu, vm: bool) -> dict[str, Any]:
    """link_speed/link_width of a pci node. In a VM the link speed is left out (NCCL then reads
    it itself, as for any attribute the file leaves unset): NVML's maximum link generation
    (nvmlDeviceGetMaxPcieLinkGeneration, "possible with this device and system") is bounded by
    the guest's virtual root port, which a KVM guest may show as an older generation than the
    real slot, and the current generation drops at idle, so neither is the real link's speed
    and pcieprof does not write a guess into NCCL_TOPO_FILE as fact (issue 23 pt 8)."""
    pcie = gpu.pcie or {}
    width = pcie.get("width_max") or pcie.get("width_current")
    attrs: dict[str, Any] = {"link_width": int(width) if width else 0}
    if not vm:
        gen = pcie.get("gen_max") or pcie.get("gen_current")
        attrs = {"link_speed": _PCI_GEN_SPEED.get(int(gen), "") if gen else "", **attrs}
    return attrs


#: Where the real tree of a simulated VM comes from (topology.json sim.real_pcie_tree).
SEEN_IN_PROFILE = ("the host's PCIe tree as the fabric profile records it (the real box's "
                   "lspci -vvv), topology.json sim.real_pcie_tree")


@dataclass(frozen=True)
class SeenTree:
    """The real PCIe tree behind the GPUs, as pcieprof has seen it (never inferred).

    Attributes:
        switches: GPU groups behind one switch (a GPU on a root port is a group of one).
        sockets: GPU groups per CPU socket (NUMA node), with `numa` their node ids.
        numa: the NUMA node of each socket group, in order.
        source: where the tree was seen.
        assumed: how the bundle's GPUs were matched to the tree's when not by bus id (a
            guest's bus ids are not its host's), with its check; "" when matched by bus id.
    """

    switches: list[list[int]]
    sockets: list[list[int]]
    numa: list[int]
    source: str
    assumed: str = ""


def seen_tree(topology: Topology, host: HostPcieTree | None = None,
              inferred: InferredTopology | None = None) -> SeenTree | None:
    """The real tree behind a VM's flat one when pcieprof has seen it (`host_tree`'s, without
    the reason)."""
    return host_tree(topology, host, inferred)[0]


def host_tree(topology: Topology, host: HostPcieTree | None = None,
              inferred: InferredTopology | None = None) -> tuple[SeenTree | None, str]:
    """(the real tree behind the GPUs, "") or (None, why not), from what pcieprof has seen:
    a simulated VM's host tree (the profile's, itself read from the real box's lspci), else
    `host` (tune/host_pcie_tree.json: the user's `lspci -vvv` of the machine the GPUs sit in). A measured
    guest cannot see its host's tree; never inferred from bandwidth levels (issue 22 pt 5:
    NCCL would trust an invented tree).

    The user's tree names host bus ids. The bundle's GPUs are matched by bus id when the tree
    holds them all (the bundle's own machine); a VM's guest bus ids are not the host's, so its
    GPUs are matched in bus order (guest GPU i = the host's i-th GPU), stated as assumed, and
    only when the measured levels agree (each group of every inferred level is whole switches
    of the tree): a mapping the measurements contradict would describe an invented tree."""
    sim = (topology.sim or {}).get("real_pcie_tree") if topology.sim else None
    if isinstance(sim, dict):
        tree = _groups(sim, {int(i): p for i, p in (sim.get("gpu_paths") or {}).items()},
                       SEEN_IN_PROFILE)
        return tree, "" if tree is not None else "the profile's tree names no GPU"
    if host is None:
        return None, "no tree seen: a guest cannot see its host's"
    raw = host.tree
    source = host.source or HostPcieTree.FILE
    paths = [p for _, p in sorted(((int(i), p) for i, p in (raw.get("gpu_paths") or {}).items()
                                   if isinstance(p, list) and p))]
    by_bdf = {str(p[0]).lower(): p for p in paths}
    ours = {g.index: str(g.bus_id or "").lower() for g in topology.gpus}
    if ours and all(b in by_bdf for b in ours.values()):
        tree = _groups(raw, {i: by_bdf[b] for i, b in ours.items()}, f"{source}, GPUs matched "
                       "by bus id")
        return tree, "" if tree is not None else f"{source}: no GPU path"
    if not topology.virtualization.is_vm:
        missing = sorted(b for b in ours.values() if b not in by_bdf)
        return None, (f"{source} does not hold this bundle's GPUs ({', '.join(missing[:3])} "
                      "not in it): an lspci of another machine")
    if len(paths) != len(ours):
        return None, (f"{source} shows {len(paths)} GPU(s), the VM {len(ours)}: which host GPUs "
                      "the guest holds is not known")
    order = sorted(ours)
    tree = _groups(raw, {i: paths[k] for k, i in enumerate(order)}, source)
    if tree is None:
        return None, f"{source}: no GPU path"
    if inferred is None:
        return None, (f"{source}: the guest's GPUs would be matched to the host's in bus order, "
                      "and this bundle has no measured levels to check that against")
    whole = [set(g) for g in tree.switches]
    for lv in inferred.levels:
        for grp in lv.groups:
            if set(grp) != set().union(*(s for s in whole if s & set(grp))):
                return None, (f"{source}: matched in bus order, the measured level "
                              f"'{lv.name}' group {','.join(map(str, grp))} splits a switch of "
                              "the host's tree: the guest's GPU order is not the host's")
    assumed = ("assumed: guest GPU i is the host's i-th GPU in bus order (the measured levels "
               "agree, but cannot tell GPUs of one switch apart); check the VM's definition "
               "(virsh dumpxml: each <hostdev>'s host <source><address> and guest <address>)")
    return SeenTree(tree.switches, tree.sockets, tree.numa, source, assumed), ""


def _groups(tree: dict[str, Any], paths: dict[int, list[str]], source: str) -> SeenTree | None:
    """Switch and socket groups of `paths` (GPU index -> [gpu bdf, ..., root port bdf]) in a
    pcie_tree object: a switch is a GPU's nearest switch upstream port (its root port when it
    has none), a socket the root port's NUMA node."""
    nodes = {n["bdf"]: n for n in tree.get("nodes", []) if isinstance(n, dict) and "bdf" in n}
    switch_of: dict[int, str] = {}
    numa_of: dict[int, int] = {}
    for idx, path in paths.items():
        kinds = [(b, nodes.get(b, {}).get("kind")) for b in path[1:]]
        up = next((b for b, k in kinds if k == "switch_upstream"), path[0])
        switch_of[int(idx)] = up
        numa_of[int(idx)] = int(nodes.get(path[-1], {}).get("numa_node") or 0)
    if not switch_of:
        return None
    switches: dict[str, list[int]] = {}
    for g in sorted(switch_of):
        switches.setdefault(switch_of[g], []).append(g)
    sockets: dict[int, list[int]] = {}
    for g in sorted(numa_of):
        sockets.setdefault(numa_of[g], []).append(g)
    return SeenTree(switches=list(switches.values()), sockets=list(sockets.values()),
                    numa=list(sockets), source=source)


def topo_xml(tree: SeenTree, topology: Topology) -> str:
    """The NCCL_TOPO_FILE text for a tree pcieprof has seen: one <cpu> per socket, one switch
    per group of more than one GPU (synthetic bus ids: the guest has no such bridge), each GPU
    under its guest bus id (NCCL matches GPUs by bus id).

    Args:
        tree: the real tree (seen_tree).
        topology: topology.json (the guest's GPU bus ids and links).

    Raises:
        ValueError: when a GPU has no bus id.
    """
    gpus = {g.index: g for g in topology.gpus}
    every = [g for grp in tree.switches for g in grp]
    missing = [i for i in every if i not in gpus or not gpus[i].bus_id]
    if missing:
        raise ValueError(f"GPU(s) {missing} have no PCI bus id in topology.json")
    used = {str(gpus[i].bus_id).lower() for i in every}
    vm = bool(topology.virtualization.is_vm)
    synthetic = _synthetic_busids(used)
    lines = ['<system version="1">']
    for numa, sock in zip(tree.numa, tree.sockets):
        lines.append(f"  <cpu {_attrs(numaid=numa)}>")
        for grp in [g for g in tree.switches if set(g) <= set(sock)]:
            indent = "    "
            if len(grp) > 1:
                first = gpus[grp[0]]
                lines.append(f"    <pci {_attrs(busid=next(synthetic), **{'class': '0x060400'}, **_link_attrs(first, vm))}>")
                indent = "      "
            for g in grp:
                gpu = gpus[g]
                lines.append(f"{indent}<pci {_attrs(busid=str(gpu.bus_id).lower(), **{'class': '0x030000'}, **_link_attrs(gpu, vm))}>")
                lines.append(f"{indent}  <gpu {_attrs(dev=g)}/>")
                lines.append(f"{indent}</pci>")
            if len(grp) > 1:
                lines.append("    </pci>")
        lines.append("  </cpu>")
    lines += ["</system>", ""]
    return "\n".join(lines)


def _synthetic_busids(used: set[str]) -> Iterator[str]:
    """Bus ids for switches the VM hides, chosen not to collide with any real device seen."""
    for bus in range(0xF0, 0xFF):
        bid = f"0000:{bus:02x}:00.0"
        if bid not in used:
            yield bid


def write_files(bundle: Bundle, ring: Ring, inferred: InferredTopology | None,
                topology: Topology | None, *, nchannels: int = 2) -> dict[str, Path]:
    """Write GRAPH_FILE (always) and TOPO_FILE (when the measured levels show switches the
    bundle's tree hides and pcieprof has seen the real one: `host_tree`) into the bundle.

    Returns:
        {"graph": path, "topo": path?}
    """
    paths = {"graph": bundle.write_text(GRAPH_FILE, graph_xml(ring, nchannels=nchannels,
                                                               inferred=inferred))}
    tree = (seen_tree(topology, bundle.read_doc(HostPcieTree), inferred)
            if topology is not None and topology.gpus and inferred is not None
            and inferred.hidden_structure else None)
    if tree is not None and topology is not None:
        try:
            paths["topo"] = bundle.write_text(TOPO_FILE, topo_xml(tree, topology))
        except ValueError:  # a GPU without a bus id: NCCL could not match the file
            pass
    return paths
