"""The VM story read from a rule context: the hang risk of a setting whose P2P runs through a
translating IOMMU, the fabric model's cost table, and why the default all-reduce costs what it
does. For the rules and the principal bottleneck (pcieprof.tune.recommend); the words they use
are pcieprof.analysis.vm_words's, which the report and `compare` share without the tuner.
"""

from __future__ import annotations


from pcieprof.analysis.virtualization import P2P_HANG, VmCost, from_topology, known_state
from pcieprof.bundle.document import decode
from pcieprof.bundle.recommendations import Risk
from pcieprof.bundle.vm_mechanism import KnownIssue
from pcieprof.tune.rules.base import RuleContext
from pcieprof.analysis.vm_words import p2p_hang_risk


def iommu_path_risk(ctx: RuleContext, env: dict[str, str], variant: str | None = None) -> Risk | None:
    """The hang risk of a recommended setting whose NCCL P2P edges run through this bundle's
    translating IOMMU (None when they do not): the fabric model's known issue for a simulated
    bundle, the NCCL facts otherwise.

    Args:
        ctx: the rule context.
        env: the setting.
        variant: the all-reduce variant that ran it, whose nccl_choices.json entry may list the
            model's known risks.
    """
    topo = ctx.topology
    if not topo.iommu.translating:
        return None
    cost = from_topology(topo)
    case = ctx.choices.cases.get(variant) if variant else None
    issue: KnownIssue | None = None
    if case is not None and case.model is not None:
        risk = next((r for r in case.model.get("known_risks") or [] if r.get("id") == P2P_HANG), None)
        issue = decode(KnownIssue, risk, "nccl_choices.json: model.known_risks") if risk else None
        if issue is None:  # the model says this setting keeps P2P off the IOMMU
            return None
    elif env.get("NCCL_P2P_DISABLE") == "1":
        return None
    if issue is None and cost is not None:
        issue = cost.known_issue(P2P_HANG)
    return p2p_hang_risk(translating=True, is_vm=bool(topo.virtualization.is_vm),
                         simulated=ctx.obtained == "simulated", issue=issue, cost=cost,
                         state=known_state(ctx.bundle))


def vm_cost(ctx: RuleContext) -> VmCost | None:
    """The fabric model's like-for-like table of this bundle, if it carries one."""
    return from_topology(ctx.topology)


def bottleneck_why(ctx: RuleContext) -> list[str]:
    """Why the default all-reduce costs what it does on a VM or behind a translating IOMMU, in
    the words of the mechanisms (the same as the VM verdict's), for the principal bottleneck."""
    topo = ctx.topology
    case = ctx.nccl_default()
    peers = case.parsed.peer_transport if case is not None and case.parsed else {}
    shm = len(case.shm_links()) if case is not None else 0
    why = []
    if topo.virtualization.is_vm:
        flat = bool(topo.virtualization.flat_pcie_tree) or bool(
            ctx.inferred is not None and ctx.inferred.hidden_structure)
        if peers and shm == len(peers):
            why.append("NCCL in the VM sends every ring step through host memory"
                       + (": the guest's flat PCIe tree shows every GPU pair as PHB" if flat else ""))
        elif flat:
            why.append("a flat virtual PCIe tree hiding the switches and sockets from NCCL")
        if topo.iommu.translating:
            why.append("the host IOMMU translates each DMA")
    elif topo.iommu.translating:
        why.append("IOMMU translating peer DMA")
    elif ctx.inferred is not None and ctx.inferred.hidden_structure:
        why.append("a flat virtual PCIe tree hiding the switches from NCCL")
    return why
