"""P2P directions that differ by more than the measurement spread: one direction throttled or broken.

A PCIe (or NVLink) path carries the same rate both ways, and NCCL's rings use both directions, so
a pair whose peer copies run much slower one way than the other has a fault on that path: a
driver that reports peer access the platform does not deliver (the real 2x RTX 4090 box of
../shared/samples/tool-outputs-more: 27.07 GB/s one way, 11.46 the other, and simpleP2P read
back NaN), or posted writes held up one way (an IOMMU translating peer DMA, ACS redirect, the
root complex). Numbers from pcieprof.analysis.p2p_checks.
"""

from __future__ import annotations

from pcieprof.analysis.p2p_checks import asymmetric_pairs, bandwidth_spread
from pcieprof.analysis.matrices import gpu_indices
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext

NEXT = ("# check the bytes the peer copies move, both ways (cuda-samples):\n"
        "./simpleP2P\n"
        "# or copy, time and check every pair and direction with pcieprof:\n"
        "pcieprof topology --quick\n"
        "# reads instead of writes, to see which side is slow (cuda-samples):\n"
        "./p2pBandwidthLatencyTest --p2p_read")


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    spread = bandwidth_spread(ctx.p2p, gpu_indices(ctx.p2p))
    found = asymmetric_pairs(ctx.p2p, spread)
    if not found:
        return []
    top = found[0]
    (fa, fb), (sa, sb) = top.fast, top.slow
    more = f" and {len(found) - 1} more pair(s)" if len(found) > 1 else ""
    return [Recommendation(
        rule="p2p_asymmetry", kind="warn", priority=400, confidence=ctx.confidence,
        title=(f"P2P {fa}->{fb} moves {top.fast_gbps:.1f} GB/s but {sa}->{sb} only "
               f"{top.slow_gbps:.1f} GB/s ({top.ratio:.1f}x){more}: P2P is likely broken or "
               f"throttled one way"),
        gain_text=("one direction of the peer path is throttled or faulty; NCCL rings send both "
                   "ways, so collectives over this pair run at the slow direction or, if the "
                   "path is broken, return wrong data"),
        action=NEXT,
        evidence=[f"p2p.csv: unidirectional P2P, largest copies: "
                  + "; ".join(f"{s.fast[0]}->{s.fast[1]} {s.fast_gbps:.2f} vs "
                              f"{s.slow[0]}->{s.slow[1]} {s.slow_gbps:.2f} GB/s"
                              for s in found[:6]) + f" [{ctx.provenance}]",
                  f"measurement spread: {spread.text()}"],
        caveats=["a driver that reports peer access it does not support (consumer GPUs, "
                 "patched drivers), an IOMMU translating peer DMA or ACS redirect are the usual "
                 "causes; until the bytes check out, run NCCL with NCCL_P2P_DISABLE=1"])]
