"""P2P slower than host-staged copies: the direct peer path loses to a detour through host memory.

A peer copy crosses the same links as a copy staged through pinned host memory, minus the round
trip to DRAM, so it should be at least as fast; where it is clearly slower the peer path is
throttled (posted writes held at a root complex, an IOMMU translating peer DMA, ACS redirect) or
broken, and NCCL's P2P transport may lose to its host-memory (SHM) one on these pairs. Real case:
6 GPUs of NVIDIA/nccl issue #814 (tests/data/importers), P2P writes 9.9 GB/s against 22 GB/s
staged. Numbers from pcieprof.analysis.p2p_checks.
"""

from __future__ import annotations

import numpy as np

from pcieprof.analysis.matrices import gpu_indices, pair_support
from pcieprof.analysis.p2p_checks import bandwidth_spread, slower_than_staged
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext

NEXT = ("# compare NCCL with and without its P2P transport (nccl-tests):\n"
        "all_reduce_perf -b 8 -e 256M -f 2 -g {n}\n"
        "NCCL_P2P_DISABLE=1 all_reduce_perf -b 8 -e 256M -f 2 -g {n}\n"
        "# or: pcieprof topology --variants default,p2p_disable\n"
        "# the host path: IOMMU mode and ACS redirect\n"
        "cat /proc/cmdline; sudo lspci -vvv | grep -i acsctl")


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    gpus = gpu_indices(ctx.p2p)
    spread = bandwidth_spread(ctx.p2p, gpus)
    found = slower_than_staged(ctx.p2p, spread)
    if not found:
        return []
    ok_dirs = sum(1 for s in pair_support(ctx.p2p, gpus).values() if s == "ok")
    worst = found[0]
    if len(found) == 1:
        what = (f"P2P {worst.src}->{worst.dst} ({worst.p2p_gbps:.1f} GB/s) is slower than the "
                f"same copy through host memory ({worst.staged_gbps:.1f} GB/s)")
    else:
        what = (f"P2P is slower than copies through host memory on {len(found)} of {ok_dirs} "
                f"GPU directions (median {np.median([f.p2p_gbps for f in found]):.1f} vs "
                f"{np.median([f.staged_gbps for f in found]):.1f} GB/s)")
    return [Recommendation(
        rule="p2p_below_staged", kind="warn", priority=300, confidence=ctx.confidence,
        title=what + ": the peer path is throttled or broken",
        gain_text=("the direct path should be at least as fast as the detour through host "
                   "memory; here NCCL's P2P transport may lose to its host-memory (SHM) one for "
                   "large messages, and a throttled path is often a broken one"),
        action=NEXT.format(n=max(len(gpus), 2)),
        evidence=[f"p2p.csv: p2p vs host_staged, unidirectional, largest copies: "
                  + "; ".join(f"{f.src}->{f.dst} {f.p2p_gbps:.2f} vs {f.staged_gbps:.2f} GB/s"
                              for f in found[:6]) + f" [{ctx.provenance}]",
                  f"measurement spread: {spread.text()}"],
        caveats=["at decode sizes latency decides, not bandwidth: measure the all-reduce "
                 "before turning P2P off"])]
