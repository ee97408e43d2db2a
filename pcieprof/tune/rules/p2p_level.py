"""NCCL_P2P_LEVEL: NCCL refuses P2P between GPUs whose P2P copies work (and are faster).

NCCL's default P2P level is PXB: pairs whose path crosses a CPU host bridge (PHB, NODE, SYS) use
shared host memory instead (NVIDIA/nccl src/graph/paths.cc, ncclTopoCheckP2p). In a VM whose
virtual tree is flat every pair looks like PHB, so NCCL may use SHM everywhere although the
copies over P2P are fast. Where the IOMMU translates the GPUs' DMA (a VFIO guest, an iommu=on
host) the P2P transport runs through it and NCCL can hang on its first collective: the
recommendation then carries that risk, how `recommend --verify` checks it safely, and the
host-side alternative (pcieprof.analysis.vm_words, pcieprof.tune.vm_context).
"""

from __future__ import annotations

from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import MIN_GAIN, RuleContext, fmt_gain, ranking
from pcieprof.tune.vm_context import iommu_path_risk, vm_cost


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    if not ctx.nccl_measured:
        return []
    base = ctx.curves.default()
    sys_ = ctx.curves.find({"NCCL_P2P_LEVEL": "SYS"})
    case = ctx.nccl_default()
    shm = case.shm_links() if case else []
    if base is None:
        return []
    if sys_ is None:
        if shm:
            ctx.needs_measuring.append("all-reduce with NCCL_P2P_LEVEL=SYS: NCCL chose SHM for "
                                       f"{len(shm)} peer link(s) by default")
        return []
    per_ar, per_step, rel = ctx.gains(base, sys_)
    large = (base.at(base.max_size) - sys_.at(base.max_size)) / base.at(base.max_size)
    if rel < MIN_GAIN and large < MIN_GAIN:
        return []
    ev = [f"allreduce.csv: variant {sys_.variant} vs {base.variant} over {base.nranks} ranks "
          f"[{ctx.provenance}]"]
    if shm:
        ev.append(f"nccl_choices.json: by default NCCL used host memory for {len(shm)} link(s), "
                  f"e.g. {', '.join(shm[:4])}")
    risk = iommu_path_risk(ctx, {"NCCL_P2P_LEVEL": "SYS"}, sys_.variant)
    cost = vm_cost(ctx)
    best = cost.at("best") if cost is not None else None
    if cost is not None and best is not None:
        ev.append(f"like for like ({cost.source}): each at its best {best.vm.time_us:.1f} us in "
                  f"the VM ({best.vm.setting}) vs {best.bare.time_us:.1f} us on bare metal "
                  f"({best.bare.setting}) at {best.size_bytes >> 10} KiB")
    return [Recommendation(
        rule="p2p_level", kind="env", env={"NCCL_P2P_LEVEL": "SYS"},
        action="export NCCL_P2P_LEVEL=SYS", **ranking(per_step, max(rel, 0.3 * large)),
        title="NCCL refuses P2P that works here: allow it at every distance (NCCL_P2P_LEVEL=SYS)",
        gain_us_per_allreduce=per_ar, gain_ms_per_step=per_step, gain_fraction=rel,
        gain_text=(fmt_gain(per_ar, per_step, base, ctx.band) if rel >= MIN_GAIN else
                   "no change at decode sizes")
                  + (f"; large messages {abs(large) * 100:.0f}% {'faster' if large >= 0 else 'slower'}"
                     if abs(large) >= 0.02 else "; no change at large messages"),
        evidence=ev, confidence=ctx.confidence,
        caveats=["only safe when P2P copies between every pair are correct (p2p.csv has no "
                 "error rows)"],
        risks=[risk] if risk else [])]
