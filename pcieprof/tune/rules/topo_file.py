"""NCCL_TOPO_FILE: tell NCCL the real tree when a VM shows a flat one, only from a tree
pcieprof has seen (pcieprof.tune.nccl_files.host_tree: a simulated VM's host tree or the user's
`lspci -vvv` of the host, never one inferred from bandwidth levels: NCCL trusts the file, and an
invented switch makes it put pairs on P2P)."""

from __future__ import annotations

from pcieprof.bundle.recommendations import Recommendation
from pcieprof.bundle.host_tree import HostPcieTree
from pcieprof.tune.nccl_files import TOPO_FILE, host_tree
from pcieprof.tune.rules.base import RuleContext
from pcieprof.tune.vm_context import iommu_path_risk


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    t = ctx.inferred
    if t is None or not t.hidden_structure or len(t.levels) < 2 or not ctx.topology.gpus:
        return []
    tree, why = host_tree(ctx.topology, ctx.bundle.read_doc(HostPcieTree), t)
    if tree is None:
        ctx.needs_measuring.append(
            f"NCCL_TOPO_FILE: the bandwidth levels suggest switches the VM hides, but pcieprof "
            f"has seen no tree to write ({why}); it writes none from bandwidth levels. Give the "
            f"hypervisor host's `lspci -vvv` to `pcieprof recommend BUNDLE --host-lspci FILE`")
        return []
    groups = " | ".join(",".join(map(str, g)) for g in tree.switches)
    path = ctx.bundle.path / TOPO_FILE
    # NCCL then sees same-switch pairs as PXB and puts them on P2P: through the IOMMU, if it
    # translates (the model cannot price the file, but the known issue applies all the same)
    risk = iommu_path_risk(ctx, {"NCCL_TOPO_FILE": str(path)})
    return [Recommendation(
        rule="topo_file", kind="launch", env={"NCCL_TOPO_FILE": str(path)},
        action=f"export NCCL_TOPO_FILE={path}" + ("" if ctx.bundle.has(TOPO_FILE) else
                                                  "   # written by: pcieprof recommend BUNDLE"),
        priority=20, confidence="predicted",
        title="Describe the real PCIe tree to NCCL (the VM hides the switches)",
        gain_text=(f"NCCL's own ring/tree search and P2P-level decisions then see the "
                   f"{len(tree.sockets)} socket(s) and the switches ({groups}); the gain has to "
                   f"be measured (rerun pcieprof topology with it)"),
        evidence=[f"the tree: {tree.source}", *t.evidence[-2:]],
        caveats=([tree.assumed] if tree.assumed else [])
                + ["switch nodes in the file carry synthetic bus ids (0000:f0.. not used by any "
                   "guest device); NCCL fills GPU attributes from the running system"]
                + (["with it NCCL puts the pairs of one switch on its P2P transport, through the "
                    "translating IOMMU"] if risk else []),
        risks=[risk] if risk else [])]
