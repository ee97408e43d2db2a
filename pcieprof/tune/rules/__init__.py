"""Recommendation rules: one small module each, `evaluate(ctx) -> list[Recommendation]`.

A rule recommends a setting only when the bundle measured (or simulated) it and it helped; when the
data cannot decide, the rule appends to `ctx.needs_measuring` what would have to be measured.
"""

from __future__ import annotations

#: Rule modules in evaluation order (correctness first, then host state, NCCL, ring, SGLang).
RULES: tuple[str, ...] = (
    "p2p_data_errors", "p2p_asymmetry", "p2p_below_staged", "p2p_support_mismatch", "p2p_levels",
    "nvlink_links",
    "allreduce_hang", "iommu_acs", "vm_enablers", "p2p_vs_shm", "p2p_level", "proto_ll", "min_nchannels",
    "ring_order", "topo_file", "sglang_custom_ar",
)

#: Rules whose warnings are findings about the fabric itself (what the P2P measurements show):
#: the strongest names the principal bottleneck when no all-reduce was measured.
FINDING_RULES: tuple[str, ...] = ("p2p_asymmetry", "p2p_below_staged", "p2p_support_mismatch",
                                  "p2p_levels", "nvlink_links")
