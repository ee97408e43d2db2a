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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator
from xml.sax.saxutils import quoteattr

from pcieprof.analysis.infer import InferredTopology
from pcieprof.bundle import Bundle
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


def _link_attrs(gpu: Gpu) -> dict[str, Any]:
    pcie = gpu.pcie or {}
    gen = pcie.get("gen_max") or pcie.get("gen_current")
    width = pcie.get("width_max") or pcie.get("width_current")
    return {"link_speed": _PCI_GEN_SPEED.get(int(gen), "") if gen else "",
            "link_width": int(width) if width else 0}


def topo_xml(inferred: InferredTopology, topology: Topology) -> str:
    """The NCCL_TOPO_FILE text for the inferred tree: one <cpu> per socket-level group, one
    synthetic switch per switch-level group (only when the group has more than one GPU).

    With only two measured levels, sockets follow the GPUs' NUMA nodes; where those are unknown
    (typical in a VM) every switch goes under one CPU, so NCCL sees PHB between switches rather
    than an invented socket boundary.

    Args:
        inferred: the inferred hierarchy.
        topology: topology.json (GPU bus ids, links, NUMA nodes).

    Raises:
        ValueError: when a GPU has no bus id (NCCL matches GPUs by bus id).
    """
    gpus = {g.index: g for g in topology.gpus}
    missing = [i for i in inferred.gpus if i not in gpus or not gpus[i].bus_id]
    if missing:
        raise ValueError(f"GPU(s) {missing} have no PCI bus id in topology.json")
    used = {str(gpus[i].bus_id).lower() for i in inferred.gpus}
    switches = inferred.switch_groups()
    if len(inferred.pcie_levels()) >= 3:
        sockets = inferred.socket_groups()
    else:
        # two levels cannot tell "through the root complex" from "across sockets": split by the
        # NUMA nodes the OS reports, and keep everything under one CPU when those are unknown
        by_numa: dict[Any, list[int]] = {}
        for grp in switches:
            by_numa.setdefault(_numa_of(grp, gpus, -1), []).extend(grp)
        sockets = [sorted(v) for _, v in sorted(by_numa.items(), key=lambda kv: kv[1][0])] \
            if -1 not in by_numa else [sorted(inferred.gpus)]
    synthetic = _synthetic_busids(used)
    lines = ['<system version="1">']
    for s_idx, sock in enumerate(sockets):
        numa = _numa_of(sock, gpus, s_idx)
        lines.append(f"  <cpu {_attrs(numaid=numa)}>")
        for grp in [g for g in switches if set(g) <= set(sock)]:
            indent = "    "
            if len(grp) > 1:
                first = gpus[grp[0]]
                lines.append(f"    <pci {_attrs(busid=next(synthetic), **{'class': '0x060400'}, **_link_attrs(first))}>")
                indent = "      "
            for g in grp:
                gpu = gpus[g]
                lines.append(f"{indent}<pci {_attrs(busid=str(gpu.bus_id).lower(), **{'class': '0x030000'}, **_link_attrs(gpu))}>")
                lines.append(f"{indent}  <gpu {_attrs(dev=g)}/>")
                lines.append(f"{indent}</pci>")
            if len(grp) > 1:
                lines.append("    </pci>")
        lines.append("  </cpu>")
    lines += ["</system>", ""]
    return "\n".join(lines)


def _numa_of(group: list[int], gpus: dict[int, Gpu], default: int) -> int:
    nodes = {int(n) for g in group if (n := gpus[g].numa_node) is not None and n != -1}
    return nodes.pop() if len(nodes) == 1 else default


def _synthetic_busids(used: set[str]) -> Iterator[str]:
    """Bus ids for switches the VM hides, chosen not to collide with any real device seen."""
    for bus in range(0xF0, 0xFF):
        bid = f"0000:{bus:02x}:00.0"
        if bid not in used:
            yield bid


def write_files(bundle: Bundle, ring: Ring, inferred: InferredTopology | None,
                topology: Topology | None, *, nchannels: int = 2) -> dict[str, Path]:
    """Write GRAPH_FILE (always) and TOPO_FILE (when the tree can be described) into the bundle.

    Returns:
        {"graph": path, "topo": path?}
    """
    paths = {"graph": bundle.write_text(GRAPH_FILE, graph_xml(ring, nchannels=nchannels,
                                                               inferred=inferred))}
    if inferred is not None and topology is not None and topology.gpus \
            and len(inferred.pcie_levels()) > 1:
        try:
            paths["topo"] = bundle.write_text(TOPO_FILE, topo_xml(inferred, topology))
        except ValueError:  # a GPU without a bus id: NCCL could not match the file
            pass
    return paths
