"""NCCL_TOPO_FILE: tell NCCL the real tree when a VM shows a flat one."""

from __future__ import annotations

from pcieprof.tune.nccl_files import TOPO_FILE
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext
from pcieprof.tune.vm_context import iommu_path_risk


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    t = ctx.inferred
    if t is None or not t.hidden_structure or len(t.levels) < 2 or not ctx.topology.gpus:
        return []
    groups = " | ".join(",".join(map(str, g)) for g in t.switch_groups())
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
        gain_text=("NCCL's own ring/tree search and P2P-level decisions then see the switches "
                   f"({groups}); the gain has to be measured (rerun pcieprof topology with it)"),
        evidence=t.evidence[-3:],
        caveats=["switch nodes in the file are synthetic (bus ids 0000:f0.. not used by any "
                 "device); NCCL fills GPU attributes from the running system"]
                + (["with it NCCL puts the pairs of one switch on its P2P transport, through the "
                    "translating IOMMU"] if risk else []),
        risks=[risk] if risk else [])]
