"""Recommendation rules: one small module each, `evaluate(ctx) -> list[Recommendation]`.

A rule recommends a setting only when the bundle measured (or simulated) it and it helped; when the
data cannot decide, the rule appends to `ctx.needs_measuring` what would have to be measured.
"""

from __future__ import annotations

from collections.abc import Callable

from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules import (allreduce_hang, iommu_acs, min_nchannels, nvlink_links,
                                 p2p_asymmetry, p2p_below_staged, p2p_data_errors, p2p_level,
                                 p2p_levels, p2p_support_mismatch, p2p_vs_shm, proto_ll,
                                 ring_order, sglang_custom_ar, topo_file, vm_enablers)
from pcieprof.tune.rules.base import RuleContext

#: The rules in evaluation order (correctness first, then host state, NCCL, ring, SGLang). A new
#: rule is a module here with `evaluate(ctx)` and a line in this tuple.
RULES: tuple[Callable[[RuleContext], list[Recommendation]], ...] = (
    p2p_data_errors.evaluate, p2p_asymmetry.evaluate, p2p_below_staged.evaluate,
    p2p_support_mismatch.evaluate, p2p_levels.evaluate, nvlink_links.evaluate,
    allreduce_hang.evaluate, iommu_acs.evaluate, vm_enablers.evaluate, p2p_vs_shm.evaluate,
    p2p_level.evaluate, proto_ll.evaluate, min_nchannels.evaluate,
    ring_order.evaluate, topo_file.evaluate, sglang_custom_ar.evaluate,
)

#: Rules whose warnings are findings about the fabric itself (what the P2P measurements show):
#: the strongest names the principal bottleneck when no all-reduce was measured.
FINDING_RULES: tuple[str, ...] = ("p2p_asymmetry", "p2p_below_staged", "p2p_support_mismatch",
                                  "p2p_levels", "nvlink_links")
