"""P2P transport vs host memory (SHM): pick the one the measurements say is faster at decode sizes."""

from __future__ import annotations

from pcieprof.units import size_label
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import MIN_GAIN, RuleContext, fmt_gain, ranking


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    if not ctx.nccl_measured:
        return []
    base = ctx.curves.default()
    off = ctx.curves.find({"NCCL_P2P_DISABLE": "1"})
    if base is None:
        return []
    if off is None:
        p = ctx.p2p
        lat_p2p = p[(p["path"] == "p2p") & p["latency_us"].notna() & (p["status"] == "ok")]["latency_us"].median()
        lat_hs = p[(p["path"] == "host_staged") & p["latency_us"].notna() & (p["status"] == "ok")]["latency_us"].median()
        if lat_p2p == lat_p2p and lat_hs == lat_hs and lat_p2p > lat_hs:
            ctx.needs_measuring.append("all-reduce with NCCL_P2P_DISABLE=1 (P2P copies are slower "
                                       "than host-staged ones here, so SHM may win)")
        return []
    per_ar, per_step, rel = ctx.gains(base, off)
    if rel >= MIN_GAIN:
        return [Recommendation(
            rule="p2p_vs_shm", kind="env", env={"NCCL_P2P_DISABLE": "1"},
            action="export NCCL_P2P_DISABLE=1", **ranking(per_step, rel),
            title="All-reduce is faster through host memory than over P2P: disable NCCL's P2P transport",
            gain_us_per_allreduce=per_ar, gain_ms_per_step=per_step, gain_fraction=rel,
            gain_text=fmt_gain(per_ar, per_step, base, ctx.band),
            evidence=[f"allreduce.csv: variant {off.variant} vs {base.variant} over {base.nranks} "
                      f"ranks at the decode band [{ctx.provenance}]"],
            caveats=[f"at {size_label(base.max_size)}: {base.at(base.max_size):.0f} us default vs "
                     f"{off.at(base.max_size):.0f} us without P2P (large messages, prefill)"],
            confidence=ctx.confidence)]
    return []
