"""NCCL_TOPO_FILE: tell NCCL the real tree when a VM shows a flat one, only from a tree
pcieprof has seen (pcieprof.tune.nccl_files.host_tree: a simulated VM's host tree or the user's
`lspci -vvv` of the host, never one inferred from bandwidth levels: NCCL trusts the file, and an
invented switch makes it put pairs on P2P).

The file is priced where the bundle prices it: a simulated VM's table (topology.json `sim.vm`)
carries the host change "give the guest the real topology", whose `how` names this file, with
the decode step before and after it. A file that slows that step is not offered as a global
setting (the card says why, with the numbers); where nothing prices it the card says it is
unpriced, and why (UNPRICED)."""

from __future__ import annotations

from pcieprof.bundle.recommendations import Recommendation
from pcieprof.bundle.host_tree import HostPcieTree
from pcieprof.tune.nccl_files import TOPO_FILE, host_tree
from pcieprof.tune.rules.base import RuleContext
from pcieprof.bundle.vm_cost import HostChange
from pcieprof.tune.vm_context import iommu_path_risk, vm_cost
from pcieprof.tune.workload import SLOWER, UNPRICED
from pcieprof.analysis.vm_words import step_gain

#: The variable this rule sets; the host change that prices it names it in its `how`.
VAR = "NCCL_TOPO_FILE"


def priced_change(ctx: RuleContext) -> HostChange | None:
    """The bundle's priced host change that the file stands for (the fabric model's "real
    topology in the guest", whose `how` names NCCL_TOPO_FILE), or None."""
    cost = vm_cost(ctx)
    return next((h for h in cost.host_changes if VAR in h.how and h.feasible),
                None) if cost is not None else None


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
    # translates (the known issue applies whatever the price)
    risk = iommu_path_risk(ctx, {"NCCL_TOPO_FILE": str(path)})
    change = priced_change(ctx)
    cost = vm_cost(ctx)
    if change is not None and cost is not None:
        (d0, d1), (b0, b1) = change.step_default_us, change.step_best_safe_us
        both = [(what, pair) for what, pair in (
            ("with NCCL's defaults", (d0, d1)),
            ("with the best setting free of the hang risk", (b0, b1)))]
        slows = [what for what, pair in both if pair[1] > pair[0] * (1 + SLOWER)]
        if slows or not (d1 < d0 * (1 - SLOWER) or b1 < b0 * (1 - SLOWER)):
            return [Recommendation(
                rule="topo_file", kind="info", env={}, priority=0.6, confidence=change.source,
                title=(f"{VAR} (the real PCIe tree) is not offered: the {change.source} decode "
                       f"step is {'slower' if slows else 'no faster'} with it"),
                action=(f"# {VAR} is not exported: it {'slows' if slows else 'does not speed'} the "
                        f"decode step here; keep NCCL's view of the guest tree. The file, to "
                        f"measure it with in the VM (one `pcieprof topology` run with it "
                        f"exported, then `pcieprof compare`): {path}"),
                gain_text=(f"all-reduces of a decode step {d0 / 1e3:.2f} -> {d1 / 1e3:.2f} ms "
                           f"with NCCL's defaults, {b0 / 1e3:.2f} -> {b1 / 1e3:.2f} ms with the "
                           f"best setting free of the hang risk ({change.source}, host change "
                           f"{change.id}, which names the file; the file: "
                           f"{len(tree.sockets)} socket(s), switches {groups})"),
                evidence=[f"topology.json sim.vm host change {change.id}: {change.effect}",
                          f"the tree: {tree.source}", *t.evidence[-1:]],
                caveats=([f"why: {change.risk}"] if change.risk else [])
                        + ([tree.assumed] if tree.assumed else []))]
        saved = (max(d0 - d1, b0 - b1)) / 1e3
        priority = 10.0 * saved
        ranked_by = (f"score {priority:.1f} = 10 x its {change.source} decode-step gain at "
                     f"batch {cost.batches[0] if cost.batches else 1}, {saved:.2f} ms")
        gain = f"{change.source}: {step_gain(cost, (d0, d1))} with NCCL's defaults ({change.title})"
    else:
        priority, ranked_by = 20.0, ""  # fixed: listed after the priced cards (base.fixed_rank)
        gain = (f"NCCL's own ring/tree search and P2P-level decisions then see the "
                f"{len(tree.sockets)} socket(s) and the switches ({groups}); the gain has to "
                f"be measured (rerun pcieprof topology with it)")
    unpriced = [] if change is not None else [
        f"{UNPRICED}{VAR}: nothing in this bundle prices the file (no all-reduce was run with "
        f"it, and no fabric-model table of this VM prices the real tree); it can make the step "
        f"slower (NCCL then sees the sockets), so measure it before serving with it"]
    return [Recommendation(
        rule="topo_file", kind="launch", env={"NCCL_TOPO_FILE": str(path)},
        action=f"export NCCL_TOPO_FILE={path}" + ("" if ctx.bundle.has(TOPO_FILE) else
                                                  "   # written by: pcieprof recommend BUNDLE"),
        confidence="predicted" if change is None else change.source,
        title="Describe the real PCIe tree to NCCL (the VM hides the switches)",
        priority=priority, ranked_by=ranked_by, gain_text=gain,
        evidence=[f"the tree: {tree.source}", *t.evidence[-2:]],
        caveats=unpriced + ([tree.assumed] if tree.assumed else [])
                + ["switch nodes in the file carry synthetic bus ids (0000:f0.. not used by any "
                   "guest device); NCCL fills GPU attributes from the running system"]
                + (["with it NCCL puts the pairs of one switch on its P2P transport, through the "
                    "translating IOMMU"] if risk else []),
        risks=[risk] if risk else [])]
