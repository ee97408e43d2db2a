"""Pairs the copy tool found without peer access while nvidia-smi says a P2P path exists.

NCCL asks CUDA, not NVML, whether two GPUs can reach each other (NVIDIA/nccl
src/transport/p2p.cc p2pCanConnect: cudaDeviceCanAccessPeer, "Could not enable P2P between
dev ..."), so where the CUDA sample (which asks the same) saw no peer access, NCCL moves that
pair's traffic through host memory even though `nvidia-smi topo -p2p` reports OK or `topo -m`
shows NVLink. Real case: the 5-GPU Proxmox box of ../shared/samples/tool-outputs (topo -p2p rw
OK on every pair, p2pBandwidthLatencyTest: GPU 0, the RTX 5070, CANNOT access any peer).
Numbers from pcieprof.analysis.p2p_checks.
"""

from __future__ import annotations

from pcieprof.analysis.p2p_checks import support_mismatches
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext

NEXT = ("# what CUDA (and so NCCL) decides, pair by pair (cuda-samples):\n"
        "./simpleP2P\n"
        "# what NCCL decided: look for 'Could not enable P2P' and 'via SHM'\n"
        "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P all_reduce_perf -b 8 -e 8M -g {n} 2>&1 "
        "| grep -E 'P2P|SHM'")


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    found = support_mismatches(ctx.p2p, ctx.topology)
    if not found:
        return []
    gpus = sorted({g for f in found for g in (f.src, f.dst)})
    pairs = ", ".join(f"{f.src}->{f.dst}" for f in found[:12])
    return [Recommendation(
        rule="p2p_support_mismatch", kind="warn", priority=150, confidence=ctx.confidence,
        title=(f"No peer access on {len(found)} GPU direction(s) ({pairs}) although nvidia-smi "
               f"reports a P2P path there"),
        gain_text=("the driver's P2P status and CUDA disagree: CUDA refuses peer access on these "
                   "pairs (different GPU models, a driver or patch that reports P2P it does not "
                   "enable, a VM without peer mappings), so NCCL sends their traffic through "
                   "host memory"),
        action=NEXT.format(n=len(gpus) if len(gpus) > 1 else 2),
        evidence=[f"p2p.csv {f.src}->{f.dst}: {f.tool_says}; topology.json: {f.topology_says}"
                  for f in found[:4]] + [f"[{ctx.provenance}]"],
        caveats=["nvidia-smi topo -p2p reports what the driver allows, not what CUDA enables; "
                 "the CUDA sample's answer is the one NCCL follows"])]
