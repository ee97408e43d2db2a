"""The machine: GPUs, the PCIe tree (root complexes, switches, NUMA), IOMMU/ACS/VM state."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go

from pcieprof.analysis.infer import value_text
from pcieprof.analysis.nodes import Nodes
from pcieprof.bundle.topology import Topology, acs_redirect
from pcieprof.report.context import ReportContext
from pcieprof.report.figures import figure, plot_text
from pcieprof.report.model import BundleView, Facts, Note, Section, Table, Tree



def _link(link: dict[str, Any] | None) -> str:
    if not link:
        return ""
    gen = link.get("gen")
    width = link.get("width")
    cap = ""
    if link.get("cap_width") and link.get("cap_width") != width:
        cap = f" (capable x{link.get('cap_width')})"
    g = f"Gen{gen} " if gen else (f"{link.get('speed_gts')} GT/s " if link.get("speed_gts") else "")
    return f"{g}x{width}{cap}" if width else g.strip()


def _gen_width(gen: Any, width: Any) -> str:
    if gen is None and width is None:
        return "unknown"
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def tree_lines(topo: Topology) -> list[tuple[int, str, str, str]]:
    """The PCIe tree as indented lines, grouped by NUMA node (depth, label, detail, css class)."""
    nodes = topo.tree_nodes()
    if not nodes:
        return []
    by_bdf = {n["bdf"]: n for n in nodes}
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for n in nodes:
        parent = n.get("parent") if n.get("parent") in by_bdf else None
        children[parent].append(n)
    gpu_by_bdf = {str(g.bus_id or "").lower(): g for g in topo.gpus}
    lines: list[tuple[int, str, str, str]] = []

    def walk(n: dict[str, Any], depth: int) -> None:
        kind = n.get("kind", "")
        label = f"{kind.replace('_', ' ')} {n['bdf']}"
        gpu = gpu_by_bdf.get(str(n["bdf"]).lower())
        if gpu is not None:
            label = f"GPU{gpu.index} {gpu.name or ''} {n['bdf']}"
        detail = " ".join(x for x in [_link(n.get("link")), n.get("description") or ""] if x)
        redirect = acs_redirect(n)
        css = kind
        if redirect:
            detail += f"  ACS {'+'.join(redirect)} on: P2P goes up to the root complex"
            css += " acs-on"
        if n.get("iommu_group") is not None:
            detail += f"  IOMMU group {n['iommu_group']}"
        lines.append((depth, label, detail, css))
        for c in sorted(children.get(n["bdf"], []), key=lambda x: x["bdf"]):
            walk(c, depth + 1)

    roots = sorted(children[None], key=lambda x: (x.get("numa_node") if x.get("numa_node") is not None else 99, x["bdf"]))
    numa_seen: set[Any] = set()
    for r in roots:
        numa = r.get("numa_node")
        if numa not in numa_seen:
            numa_seen.add(numa)
            lines.append((0, f"NUMA node {numa if numa is not None else '?'}", "", "numa"))
        walk(r, 1)
    return lines


def inferred_tree_lines(inferred: dict[str, Any]) -> list[tuple[int, str, str, str]]:
    """The tuner's inferred hierarchy as tree lines, coarsest level first."""
    levels = inferred["levels"]
    lines: list[tuple[int, str, str, str]] = []

    def walk(k: int, group: list[int], depth: int) -> None:
        if k < 0:
            for g in group:
                lines.append((depth, f"GPU{g}", "", "gpu"))
            return
        subs = [sub for sub in levels[k]["groups"] if set(sub) <= set(group)]
        if len(subs) == 1 and k > 0:
            walk(k - 1, group, depth)
            return
        for sub in subs:
            if len(sub) > 1:
                lines.append((depth, levels[k]["name"], f"GPUs {','.join(map(str, sub))}, typical "
                              f"pair {value_text(levels[k]['value'], '')}", "switch_upstream"))
                walk(k - 1, sub, depth + 1)
            else:
                walk(-1, sub, depth)

    top = levels[-1]
    lines.append((0, top["name"], f"typical pair {value_text(top['value'], '')}", "numa"))
    walk(len(levels) - 2, sorted(g for grp in top["groups"] for g in grp), 1)
    return lines


_KIND_COLOR = {"numa": "#6e7781", "root_port": "#8250df", "switch_upstream": "#0550ae",
               "switch_downstream": "#218bff", "bridge": "#57606a", "gpu": "#1a7f37",
               "endpoint": "#bf8700"}


def tree_figure(topo: Topology) -> go.Figure | None:
    """The PCIe tree drawn top-down (plotly icicle): NUMA node -> root port -> switches -> GPUs."""
    nodes = topo.tree_nodes()
    if not nodes:
        return None
    by_bdf = {n["bdf"]: n for n in nodes}
    gpu_by_bdf = {str(g.bus_id or "").lower(): g for g in topo.gpus}
    ids: list[str] = []
    labels: list[str] = []
    parents: list[str] = []
    colors: list[str] = []
    hover: list[str] = []
    for numa in sorted({n.get("numa_node") for n in nodes if n.get("parent") not in by_bdf},
                       key=lambda x: (x is None, x)):
        ids.append(f"numa:{numa}")
        labels.append(f"NUMA {numa if numa is not None else '?'}")
        parents.append("")
        colors.append(_KIND_COLOR["numa"])
        hover.append("NUMA node")
    for n in nodes:
        parent = str(n["parent"]) if n.get("parent") in by_bdf else f"numa:{n.get('numa_node')}"
        gpu = gpu_by_bdf.get(str(n["bdf"]).lower())
        kind = n.get("kind", "")
        short = {"root_port": "root port", "switch_upstream": "switch", "switch_downstream": "port",
                 "gpu": "GPU", "bridge": "bridge", "endpoint": "device"}.get(kind, kind)
        label = f"GPU{gpu.index}" if gpu is not None else short
        redirect = acs_redirect(n)
        ids.append(n["bdf"])
        labels.append(plot_text(label + (" (ACS redirect)" if redirect else "")))
        parents.append(parent)
        colors.append("#cf222e" if redirect else _KIND_COLOR.get(kind, "#8c959f"))
        hover.append(plot_text(f"{n['bdf']} {kind} {_link(n.get('link'))} {n.get('description') or ''}"))
    fig = go.Figure(go.Icicle(ids=ids, labels=labels, parents=parents,
                              marker={"colors": colors}, hovertext=hover,
                              hovertemplate="%{hovertext}<extra></extra>",
                              tiling={"orientation": "v"}, textfont={"color": "white"}))
    fig.update_layout(margin={"l": 10, "r": 10})
    return fig


def level_table(topo: Topology) -> Table | None:
    """Pairwise levels as `nvidia-smi topo -m` prints them, with P2P read/write status."""
    gpus = sorted(g.index for g in topo.gpus)
    if not topo.pairs or not gpus:
        return None
    lv = {}
    for p in topo.pairs:
        cell = str(p.level if p.level is not None else "?")
        if p.p2p.get("read") and p.p2p.get("read") != "OK":
            cell += f" (P2P read {p.p2p.get('read')})"
        lv[(p.a, p.b)] = lv[(p.b, p.a)] = cell
    rows = [[f"GPU{a}"] + [("X" if a == b else lv.get((a, b), "")) for b in gpus] for a in gpus]
    return Table("pairwise levels (nvidia-smi topo -m vocabulary: PIX < PXB < PHB < NODE < SYS)",
                 ["", *[f"GPU{b}" for b in gpus]], rows)


def build(view: BundleView, ctx: ReportContext) -> Section | None:
    """The machine section from topology.json, or None without one."""
    topo = view.doc(Topology)
    if topo is None:
        return None
    prov = view.provenance("discovery")
    sec = Section("machine", "The machine")
    drv = topo.driver or {}
    iommu = topo.iommu
    virt = topo.virtualization
    facts: list[tuple[str, Any]] = [
        ("host", view.measured_host or view.origin()),
        ("GPUs", (f"{len(topo.gpus)} x {', '.join(sorted({str(g.name) for g in topo.gpus}))}")
         if topo.gpus else "none found"),
        ("driver / CUDA driver", f"{drv.get('driver_version') or 'unknown'} / {drv.get('cuda_driver_version') or 'unknown'}"),
        ("IOMMU", f"{'on' if iommu.enabled else ('off' if iommu.enabled is False else 'unknown')}, mode {iommu.mode}"
         + (" (host view: the hypervisor's, from the fabric model)" if virt.is_vm
            and str(iommu.cmdline or "").startswith("(host)") else
            " (guest view: the host's IOMMU is not visible from a guest)" if virt.is_vm else "")),
        ("kernel command line", iommu.cmdline or "unknown"),
        ("virtualization", ("VM" if virt.is_vm else ("bare metal" if virt.is_vm is False else "unknown"))
         + (f" ({virt.hypervisor})" if virt.hypervisor else "")),
        ("flat virtual PCIe tree", {True: "yes: the guest cannot see the real switches", False: "no",
                                     None: "unknown"}.get(virt.flat_pcie_tree)),
    ]
    nodes = topo.tree_nodes()
    acs_on = topo.acs_redirect_bridges()
    acs = (f"on at {len(acs_on)} bridge(s): {', '.join(acs_on[:8])}" if acs_on
           else ("off on every bridge" if nodes else "unknown"))
    if virt.is_vm:  # a guest sees its virtual bridges only: the host's ACS is the host's view
        acs = (f"guest view: {acs} of the guest's virtual bridges; the host's ACS is not visible "
               f"from a guest (on the host: sudo lspci -vvv | grep -i acsctl)")
    facts.append(("ACS P2P redirect", acs))
    sec.blocks.append(Facts("state", facts, provenance=prov))
    several = Nodes.of(view.bundle)
    if several is not None:  # this bundle is one node of several: the layout, and where rows are
        sec.blocks.append(Facts(f"nodes: {several.describe()} (the state above is node "
                                f"{several.layout.node_rank}'s)", list(several.facts()),
                                provenance=prov))
    for ev in iommu.evidence[:5] + virt.evidence[:5]:
        sec.blocks.append(Note(f"evidence: {ev}"))
    if topo.gpus:
        rows = []
        for g in topo.gpus:
            pcie = g.pcie or {}
            rows.append([g.index, g.name, g.bus_id,
                         _gen_width(pcie.get("gen_current"), pcie.get("width_current")),
                         _gen_width(pcie.get("gen_max"), pcie.get("width_max")),
                         g.numa_node, g.cpu_affinity,
                         round(g.memory_bytes / 2**30, 1) if g.memory_bytes else None,
                         g.virtualization_mode])
        idle = next((g.pcie.get("note") for g in topo.gpus if g.pcie.get("note")), None)
        if idle:  # discovery reads the link before any load: a lower gen is power saving
            sec.blocks.append(Note(idle))
        cols = ["index", "name", "bus id", "link at idle", "link max", "NUMA", "CPU affinity",
                "memory GiB", "virt. mode"]
        if len({str(g.name) for g in topo.gpus}) == 1:  # "GPUs" above names it: room for the rest
            cols.pop(1)
            rows = [r[:1] + r[2:] for r in rows]
        sec.blocks.append(Table("GPUs", cols, rows, provenance=prov))
    fig = tree_figure(topo)
    if fig is not None:
        sec.blocks.append(figure(fig, "PCIe tree, top-down: NUMA node, root ports, switches, GPUs "
                                      "(red: ACS redirect on)", prov, height=360))
    lines = tree_lines(topo)
    if lines:
        sec.blocks.append(Tree("PCIe tree as text (root ports, switches, GPUs; links, ACS, IOMMU "
                               "groups; by NUMA node)", lines, prov, collapsed=fig is not None))
    else:
        sec.blocks.append(Note("PCIe tree: not discovered", "missing"))
    doc = ctx.recommendations_for(view)
    inferred = doc.inferred if doc else None
    if inferred and inferred.get("hidden_structure") and len(inferred.get("levels", [])) > 1:
        sec.blocks.append(Tree("inferred real tree (from the P2P measurements; the visible tree "
                               "hides it)", inferred_tree_lines(inferred),
                               f"inferred from {inferred.get('metric')}; {prov}",
                               collapsed=True))  # Recommendations shows it as a table
    t = level_table(topo)
    if t:
        t.provenance = prov
        sec.blocks.append(t)
    return sec
