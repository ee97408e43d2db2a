"""P2P that reports success but moves wrong bytes (seen in VMs): turn P2P off until fixed."""

from __future__ import annotations

from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext
from pcieprof.tune.workload import UNPRICED

ENV = {"NCCL_P2P_DISABLE": "1"}


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    p = ctx.p2p
    bad = p[(p["path"] == "p2p") & (p["status"].isin(["error", "hang"]))]
    if bad.empty:
        return []
    pairs = sorted({(int(r.src), int(r.dst), str(r.status)) for r in bad.itertuples()})
    shown = ", ".join(f"{s}->{d} {st}" for s, d, st in pairs[:12])
    detail = next((str(d) for d in bad["detail"] if str(d)), "")
    staged_ok = not p[(p["path"] == "host_staged") & (p["status"] == "ok")].empty
    return [Recommendation(
        rule="p2p_data_errors", kind="env", priority=1000,
        title="P2P copies fail or return wrong data: disable NCCL's P2P transport",
        env=dict(ENV), action="export NCCL_P2P_DISABLE=1",
        gain_text="correctness: collectives over a broken P2P path hang or corrupt results",
        evidence=[f"p2p.csv: {len(pairs)} GPU pair(s) with status error/hang on path=p2p "
                  f"({shown}){'; ' + detail if detail else ''}",
                  "host-staged copies between the same GPUs are ok" if staged_ok else
                  f"host-staged copies were not {ctx.obtained} ok either"],
        caveats=([] if ctx.curves.find(ENV) is not None else [
            f"{UNPRICED}NCCL_P2P_DISABLE=1: set for correctness, not for speed; no all-reduce of "
            f"this bundle ran with it, so what it costs here is not priced"]) + [
                 "NCCL then moves everything through host memory (SHM): slower at large sizes; "
                 "fix the IOMMU/ACS/driver path (see the host rules) and re-measure",
                 "likely: the driver reports peer access the platform does not deliver (consumer "
                 "GPUs, a P2P-enabling driver patch, an IOMMU translating peer DMA, ACS "
                 "redirect); the copy may still report a bandwidth",
                 "next: after a host or driver change, check the bytes again with cuda-samples' "
                 "simpleP2P or `pcieprof topology --quick` (every copy checked, both ways)"],
        confidence=ctx.confidence if ctx.ar_backend != "cpu" else "measured")]
