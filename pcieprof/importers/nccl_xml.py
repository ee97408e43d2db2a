"""NCCL topology XML (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`) and graph XML (`NCCL_GRAPH_FILE`).

Topology (NVIDIA/nccl src/graph/xml.cc, topo.cc): `<system version="1">` holding `<cpu numaid=
affinity= arch= vendor= familyid= modelid=>`, and under each CPU `<pci busid= class= vendor=
device= link_speed= link_width=>` elements (nested through switches) with `<gpu dev= sm= rank=
gdr=>` (and `<nvlink target= count= tclass=>`) or `<nic>` / `<net name= dev= speed= ...>`.
The topology files clouds ship for their VMs (Azure/azhpc-images `topology/ndv2-topo.xml`,
`ndv4-topo.xml`) only place PCI devices: `<pci busid="0001:00:00.0" class="0x030200"/>` for a GPU
and class `0x020700` (InfiniBand) for a NIC, without `<gpu>` or `<net>`; NCCL adds those to the
matching PCI node at run time from what it detects (ncclTopoFillGpu / ncclTopoFillNet in
src/graph/xml.cc look a node up by busid). Such GPUs and NICs are listed apart (`pci_gpus`,
`pci_nics`, by PCI class) and never given a CUDA index.

Graphs (src/graph/search.cc, ncclTopoGetGraphFromXmlSub / ncclTopoGetChannelFromXml): root
`<graphs version="1">`, each `<graph>` with the integer attributes id, pattern, crossnic,
nchannels, samechannels, the floats speedintra, speedinter (latencyinter optional, 0 when
missing), the link types typeintra / typeinter (LOC, NVL, NVB, C2C, PIX, PXB, PXN, P2C, PHB, SYS,
NET, DIS), and `<channel>` children listing `<net dev=>` and `<gpu dev=>` in order. NCCL refuses a
file whose root is not `graphs`, a graph missing one of those attributes or with an unknown link
type, and a `<gpu>`/`<net>` without `dev`; this parser refuses the same, and also what would leave
NCCL with garbage: a channel without GPUs, channels of different GPU counts, a GPU twice in one
channel, and `nchannels` not matching the channels given.

What NCCL 2.2x dumps (NCCL_GRAPH_DUMP_FILE; src/graph/search.cc ncclTopoGetXmlFromGraphs, called
with every graph of the communicator: ring, tree, CollNet chain, CollNet direct, NVLS): a graph
that found nothing is written with nchannels="0" and no `<channel>` (accepted: e.g. the tree graph
id 2 in the dump of NVIDIA/nccl issue #524), an NVLS graph (id 3 there) lists only the first GPU
of each channel, and `dev` is written by xmlSetAttrLong as `%#lx` ("0", "0x1", "0xa": xml.h) and
read back with strtol(str, NULL, 16) (ncclTopoGetChannelFromXml). Older releases wrote and read
`dev` as a decimal int (xmlSetAttrInt "%d", xmlGetAttrInt). So a `dev` with `0x` or a hex letter is
hex, and one of digits only is taken as written by those older releases (decimal); the one value
both read alike is what pcieprof writes (`pcieprof.schema.nccl_dev`: the "0x" form).
Pattern numbers (src/include/graph.h): 1 balanced tree, 2 split tree, 3 tree, 4 ring, 5 NVLS,
6 CollNet direct.
"""

from __future__ import annotations

import re
import xml.parsers.expat
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from pcieprof.bundle.nccl_graph import Graph, GraphChannel, NcclGraph
from pcieprof.bundle.nccl_topo import (NcclTopo, NvLink, PciGpu, PciNic, TopoCpu, TopoGpu,
                                       TopoNic, TopoPci, VirtualTree)
from pcieprof.importers._text import fail
from pcieprof.importers.topology import flat_tree_evidence
from pcieprof.schema import NCCL_PATH_TYPES

N = TypeVar("N", int, float)


PATTERNS = {1: "balanced_tree", 2: "split_tree", 3: "tree", 4: "ring", 5: "nvls",
            6: "collnet_direct"}


#: Deepest element nesting accepted. NCCL's own files nest system > cpu > pci (one level per PCIe
#: switch) > gpu/nic > net/nvlink: under a dozen levels on real machines; 64 is an assumed bound
#: far above that and far below Python's recursion limit.
MAX_DEPTH = 64


@dataclass
class Node:
    """An XML element with the line it starts on."""

    tag: str
    attrs: dict[str, str]
    line: int
    children: list["Node"] = field(default_factory=list)


def parse_xml(text: str, name: str) -> Node:
    """Parse XML keeping line numbers; malformed or truncated XML -> one-line BadInput."""
    stack: list[Node] = []
    root: list[Node] = []
    parser = xml.parsers.expat.ParserCreate()

    def start(tag: str, attrs: dict[str, str]) -> None:
        if len(stack) >= MAX_DEPTH:  # the walks over the tree below recurse: bound it here
            fail(name, parser.CurrentLineNumber, f"elements nested at most {MAX_DEPTH} deep",
                 got=f"<{tag}> inside {len(stack)} others")
        node = Node(tag, dict(attrs), parser.CurrentLineNumber)
        if stack:
            stack[-1].children.append(node)
        else:
            root.append(node)
        stack.append(node)

    def end(_tag: str) -> None:
        stack.pop()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(text, True)
    except xml.parsers.expat.ExpatError as exc:
        what = xml.parsers.expat.ErrorString(exc.code)
        # At the end of a cut file expat points past the last line: name the last line instead.
        lineno = min(exc.lineno, max(1, len(text.splitlines())))
        fail(name, lineno, f"well-formed XML ({what}"
             + ("; the file looks truncated)" if "no element" in what or "unclosed" in what
                or "incomplete" in what else ")"))
    if not root:
        fail(name, 1, "an XML document")
    return root[0]


def looks_like_topo(text: str) -> bool:
    """True for an NCCL topology XML (`<system ...>` root)."""
    return bool(re.match(r"\s*(<\?xml[^>]*>\s*)?<system[\s>]", text))


def looks_like_graph(text: str) -> bool:
    """True for an NCCL graph XML (`<graphs ...>` root)."""
    return bool(re.match(r"\s*(<\?xml[^>]*>\s*)?<graphs[\s>]", text))


def _attr(node: Node, attr: str, name: str, convert: Callable[[str], N], what: str,
          required: bool) -> N | None:
    """Attribute `attr` of `node` converted, None when absent and not required; else the
    importers' one-line error naming the attribute and what it should hold."""
    v = node.attrs.get(attr)
    if v is None:
        if required:
            fail(name, node.line, f"attribute {attr}=\"<{what}>\" on <{node.tag}>")
        return None
    try:
        return convert(v)
    except ValueError:
        fail(name, node.line, f"{'an' if what[0] in 'aeiou' else 'a'} {what} for {attr} on "
             f"<{node.tag}>", got=v)


def _int(node: Node, attr: str, name: str, *, required: bool = True, base: int = 10
         ) -> int | None:
    return _attr(node, attr, name, lambda v: int(v, base), "integer", required)


def _graph_dev(v: str) -> int:
    """A graph file's `dev`: hex with `0x` or a hex letter (NCCL 2.2x, see the module
    docstring), else decimal (older releases)."""
    t = v.strip()
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", t) or re.fullmatch(r"[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*", t):
        return int(t, 16)
    return int(t, 10)


def _float(node: Node, attr: str, name: str, *, required: bool = True) -> float | None:
    return _attr(node, attr, name, float, "number", required)


def _required(value: N | None) -> N:
    """A value read with required=True (the reader raised BadInput where it was missing)."""
    assert value is not None
    return value


def parse_graph_xml(text: str, name: str = "<graph.xml>") -> NcclGraph:
    """Parse an NCCL graph file (`NCCL_GRAPH_FILE` / `NCCL_GRAPH_DUMP_FILE`).

    Args:
        text: the XML.
        name: file name for messages.

    Returns:
        The typed document (pcieprof.bundle.nccl_graph: the graphs with their channels).

    Raises:
        BadInput: what NCCL would refuse or misread (see the module docstring), with the line.
    """
    root = parse_xml(text, name)
    if root.tag != "graphs":
        fail(name, root.line, "the root element <graphs version=\"1\">", got=f"<{root.tag}>")
    version = _int(root, "version", name)
    if version != 1:
        fail(name, root.line, "graphs version=\"1\" (the only version NCCL writes)",
             got=str(version))
    graphs: list[Graph] = []
    ids: set[int] = set()
    for g in root.children:
        if g.tag != "graph":
            fail(name, g.line, "<graph> elements inside <graphs>", got=f"<{g.tag}>")
        types: dict[str, str] = {}
        for k in ("typeintra", "typeinter"):
            v = g.attrs.get(k)
            if v is None:
                fail(name, g.line, f"attribute {k}=\"<link type>\" on <graph>")
            if v not in NCCL_PATH_TYPES:
                fail(name, g.line, f"{k} in {', '.join(NCCL_PATH_TYPES)}", got=v)
            types[k] = v
        lat = _float(g, "latencyinter", name, required=False)
        rec = Graph(id=_required(_int(g, "id", name)), pattern=_required(_int(g, "pattern", name)),
                    crossnic=_required(_int(g, "crossnic", name)),
                    nchannels=_required(_int(g, "nchannels", name)),
                    samechannels=_required(_int(g, "samechannels", name)),
                    speedintra=_required(_float(g, "speedintra", name)),
                    speedinter=_required(_float(g, "speedinter", name)),
                    latencyinter=0.0 if lat is None else lat, typeintra=types["typeintra"],
                    typeinter=types["typeinter"])
        if rec.id in ids:
            fail(name, g.line, f"a graph id not used before (id {rec.id} repeats)")
        ids.add(rec.id)
        rec.pattern_name = PATTERNS.get(rec.pattern, "unknown")
        channels: list[GraphChannel] = []
        width: int | None = None
        for ch in g.children:
            if ch.tag != "channel":
                fail(name, ch.line, "<channel> elements inside <graph>", got=f"<{ch.tag}>")
            gpus: list[int] = []
            nets: list[int] = []
            for dev in ch.children:
                if dev.tag not in ("gpu", "net"):
                    fail(name, dev.line, "<gpu dev=...> or <net dev=...> inside <channel>",
                         got=f"<{dev.tag}>")
                d = _attr(dev, "dev", name, _graph_dev, "integer", True)
                assert d is not None  # required: _attr raised otherwise
                (gpus if dev.tag == "gpu" else nets).append(d)
                if dev.tag == "gpu" and gpus.count(d) > 1:
                    fail(name, dev.line, f"each GPU once per channel (gpu dev={d} repeats)")
            if not gpus:
                fail(name, ch.line, "at least one <gpu dev=...> in the channel")
            if width is not None and len(gpus) != width:
                fail(name, ch.line, f"{width} GPUs in every channel of the graph", got=str(len(gpus)))
            width = len(gpus)
            channels.append(GraphChannel(gpus, nets))
        if not channels and rec.nchannels != 0:
            fail(name, g.line, "at least one <channel> in the graph (or nchannels=\"0\")")
        if rec.nchannels != len(channels):
            fail(name, g.line, f"nchannels=\"{len(channels)}\" (the number of <channel> elements)",
                 got=str(rec.nchannels))
        rec.channels = channels
        graphs.append(rec)
    if not graphs:
        fail(name, root.line, "at least one <graph> inside <graphs>")
    return NcclGraph(version=version, graphs=graphs)


def parse_topo_xml(text: str, name: str = "<topo.xml>") -> NcclTopo:
    """Parse an NCCL topology file (`NCCL_TOPO_FILE` / `NCCL_TOPO_DUMP_FILE`).

    Args:
        text: the XML.
        name: file name for messages.

    Returns:
        The typed document (pcieprof.bundle.nccl_topo): CPUs (NUMA nodes, `cpus` the list form
        of the affinity mask), PCI nodes with their parent, GPUs with the PCI path up to their
        CPU and their NVLinks, NICs, the PCI devices of a display class (`pci_gpus`, whether or
        not a <gpu> is under them) and of a NIC class (`pci_nics`: Ethernet 0x0200 /
        InfiniBand 0x0207), and `virtual_tree` (a VM's flat virtual PCI tree, with evidence).

    Raises:
        BadInput: malformed XML, a root other than <system>, a CPU without numaid, a PCI device
            without busid, a GPU without dev, with the line.
    """
    root = parse_xml(text, name)
    if root.tag != "system":
        fail(name, root.line, "the root element <system version=\"1\">", got=f"<{root.tag}>")
    out = NcclTopo(version=_required(_int(root, "version", name)))

    def walk(node: Node, numaid: int | None, path: list[str]) -> None:
        for child in node.children:
            if child.tag == "cpu":
                nid = _required(_int(child, "numaid", name))
                aff = child.attrs.get("affinity")
                out.cpus.append(TopoCpu(numaid=nid, affinity=aff,
                                        cpus=_mask_to_list(aff, name, child.line),
                                        arch=child.attrs.get("arch"),
                                        vendor=child.attrs.get("vendor"),
                                        familyid=_int(child, "familyid", name, required=False),
                                        modelid=_int(child, "modelid", name, required=False)))
                walk(child, nid, [])
            elif child.tag == "pci":
                bus = child.attrs.get("busid")
                if not bus:
                    fail(name, child.line, "attribute busid=\"dddd:bb:dd.f\" on <pci>")
                bus = bus.lower()
                width = child.attrs.get("link_width")
                out.pci.append(TopoPci(busid=bus, parent=path[-1] if path else None,
                                       numaid=numaid, class_=child.attrs.get("class"),
                                       vendor=child.attrs.get("vendor"),
                                       device=child.attrs.get("device"),
                                       link_speed=child.attrs.get("link_speed") or None,
                                       link_width=int(width) if width and width.isdigit()
                                       else None))
                cls = (child.attrs.get("class") or "").lower()
                if cls.startswith(_GPU_CLASSES):
                    out.pci_gpus.append(PciGpu(bus, numaid, list(reversed(path + [bus]))))
                elif cls.startswith(_NIC_CLASSES):
                    out.pci_nics.append(PciNic(bus, numaid, cls))
                walk(child, numaid, path + [bus])
            elif child.tag == "gpu":
                out.gpus.append(TopoGpu(
                    dev=_required(_int(child, "dev", name)),
                    rank=_int(child, "rank", name, required=False),
                    sm=_int(child, "sm", name, required=False),
                    gdr=_int(child, "gdr", name, required=False),
                    busid=path[-1] if path else None, numaid=numaid,
                    pci_path=list(reversed(path)),
                    nvlinks=[NvLink(n.attrs.get("target"),
                                    _int(n, "count", name, required=False), n.attrs.get("tclass"))
                             for n in child.children if n.tag == "nvlink"]))
            elif child.tag == "nic":
                walk(child, numaid, path)
            elif child.tag == "net":
                out.nics.append(TopoNic(
                    dev=_required(_int(child, "dev", name)), name=child.attrs.get("name"),
                    guid=child.attrs.get("guid"),
                    speed=_int(child, "speed", name, required=False),
                    port=_int(child, "port", name, required=False),
                    maxconn=_int(child, "maxconn", name, required=False),
                    gdr=_int(child, "gdr", name, required=False),
                    latency=_float(child, "latency", name, required=False),
                    busid=path[-1] if path else None, numaid=numaid))
            else:
                walk(child, numaid, path)

    walk(root, None, [])
    if not out.cpus:
        fail(name, root.line, "at least one <cpu numaid=...> inside <system>")
    out.virtual_tree = _virtual_tree(out, name)
    return out


#: PCI class codes (base class, subclass) of GPUs: VGA-compatible and 3D controllers.
_GPU_CLASSES = ("0x0300", "0x0302")
#: ... and of the NICs NCCL uses: Ethernet and InfiniBand controllers.
_NIC_CLASSES = ("0x0200", "0x0207")


def _virtual_tree(doc: NcclTopo, name: str) -> VirtualTree:
    """Whether the dump describes a VM's flat virtual PCI tree, with the evidence.

    Decisive: every GPU on bus 00 (flat_tree_evidence), or no PCI bridge above any GPU together
    with no link speed for any of them (NCCL reads link_speed/link_width from sysfs; a virtual
    device without a PCIe link gives "" and 0). Supporting: numaid="-1" (the guest was given no
    NUMA information).
    """
    # A cloud's file places GPUs by PCI class only (no <gpu>): judge those PCI nodes.
    gpus: list[TopoGpu] | list[PciGpu] = doc.gpus or doc.pci_gpus
    if not gpus:
        return VirtualTree()
    bus00 = flat_tree_evidence([g.busid for g in gpus], name)
    evidence = list(bus00)
    pci = {p.busid: p for p in doc.pci}
    no_bridge = all(len(g.pci_path) <= 1 for g in gpus)
    no_link = all(not (node := pci.get(g.busid or "")) or not (node.link_speed or node.link_width)
                  for g in gpus)
    if no_bridge:
        evidence.append(f"{name}: no PCI bridge between any GPU and its CPU")
    if no_link:
        evidence.append(f'{name}: link_speed="" and link_width="0" on every GPU: no PCIe link '
                        "NCCL could read, as for a hypervisor's virtual device")
    if any(c.numaid == -1 for c in doc.cpus):
        evidence.append(f'{name}: numaid="-1": the guest was given no NUMA information')
    return VirtualTree(flat=bool(bus00) or (no_bridge and no_link), evidence=evidence)


def _mask_to_list(mask: str | None, name: str, line: int) -> str | None:
    """NCCL's affinity mask ("00000000,00ffffff", 32-bit words, most significant first) as a
    CPU list like "0-23"."""
    if not mask:
        return None
    try:
        value = int(mask.replace(",", ""), 16)
    except ValueError:
        fail(name, line, "a hex CPU mask for affinity", got=mask)
    cpus = [i for i in range(value.bit_length()) if value >> i & 1]
    ranges: list[str] = []
    for c in cpus:
        if ranges and "-" in ranges[-1] and int(ranges[-1].split("-")[1]) == c - 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{c}"
        elif ranges and "-" not in ranges[-1] and int(ranges[-1]) == c - 1:
            ranges[-1] = f"{ranges[-1]}-{c}"
        else:
            ranges.append(str(c))
    return ",".join(ranges)


def summarize_graph(doc: NcclGraph) -> str:
    """One line per graph file: pattern, channels and the first channel's GPU order."""
    parts = []
    for g in doc.graphs:
        # NCCL's own dumps may hold a graph with no <channel> (NVLS, trees it did not keep):
        # those show no GPU order rather than failing the import.
        order = (f"({' '.join(map(str, g.channels[0].gpus))}) " if g.channels
                 else "(no channels) ")
        parts.append(f"graph {g.id} {g.pattern_name} x{g.nchannels} {order}{g.typeintra}")
    return "NCCL graph XML: " + "; ".join(parts)


def summarize_topo(doc: NcclTopo) -> str:
    """One line: CPUs, GPUs, NICs (those only placed by PCI class said so)."""
    if doc.gpus or not doc.pci_gpus:
        devices = f"{len(doc.gpus)} GPUs, {len(doc.nics)} NICs"
    else:
        devices = (f"{len(doc.pci_gpus)} GPUs and {len(doc.pci_nics)} NICs placed by PCI "
                   "class (no <gpu>/<net>: NCCL adds them at run time)")
    return (f"NCCL topology XML: {len(doc.cpus)} CPUs/NUMA nodes, {devices}, "
            f"{len(doc.pci)} PCI devices")
