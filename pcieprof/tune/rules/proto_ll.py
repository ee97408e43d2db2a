"""LL vs Simple: below some size NCCL's LL protocol is faster, and the default may pick Simple.

Known case (../shared/calibration/README.md, voipmonitor/rtx6kpro optimization/nccl-tuning.md):
dual AMD Turin, 8 GPUs: NCCL assumed a slow inter-socket link and chose Simple with 2 channels;
NCCL_PROTO=LL (or a graph file) took 32-256 KB all-reduces from ~48-56 us to 26-37 us.
"""

from __future__ import annotations

from pcieprof.units import size_label
from pcieprof.analysis.curves import Curve
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import MIN_GAIN, RuleContext, fmt_gain, ranking


def crossover(base: Curve, ll: Curve) -> int | None:
    """Largest measured size where LL is still faster than the default (bytes), or None."""
    sizes = [s for s in ll.time_us.index if s in base.time_us.index]
    faster = [s for s in sizes if ll.time_us[s] < base.time_us[s]]
    return int(max(faster)) if faster else None


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    if not ctx.nccl_measured:
        return []
    base = ctx.curves.default()
    ll = ctx.curves.find({"NCCL_PROTO": "LL"})
    if base is None:
        return []
    if ll is None:
        ctx.needs_measuring.append("all-reduce with NCCL_PROTO=LL (and Simple) to see whether "
                                   "the default protocol is the fastest at decode sizes")
        return []
    per_ar, per_step, rel = ctx.gains(base, ll)
    if rel < MIN_GAIN:
        return []
    cross = crossover(base, ll)
    big = ll.max_size
    big_loss = (ll.at(big) - base.at(big)) / base.at(big)
    caveats = []
    if big_loss > MIN_GAIN:
        caveats.append(f"LL is {big_loss * 100:.0f}% slower at {size_label(big)} (large "
                       f"messages, prefill): NCCL_PROTO=LL applies to every size")
    if cross:
        caveats.append(f"LL is faster up to {size_label(cross)} in this bundle")
    evidence = [f"allreduce.csv: variant {ll.variant} (NCCL_PROTO=LL) vs {base.variant} over "
                f"{base.nranks} ranks, {size_label(ctx.band.lo_bytes)}..{size_label(ctx.band.hi_bytes)} "
                f"[{ctx.provenance}]"]
    protos = ctx.chosen_protocols()
    if protos:
        evidence.append("nccl_choices.json: by default NCCL's tuner chose " + ", ".join(
            f"{p} for {len(v)} size(s) ({size_label(min(v))}..{size_label(max(v))})"
            for p, v in sorted(protos.items())) + " in the decode band")
    nch = ctx.default_nchannels()
    if nch:
        evidence.append(f"nccl_choices.json: {nch} channel(s) by default")
    return [Recommendation(
        rule="proto_ll", kind="env", env={"NCCL_PROTO": "LL"}, action="export NCCL_PROTO=LL",
        **ranking(per_step, rel),
        title="Use NCCL's LL protocol for decode-sized all-reduces",
        gain_us_per_allreduce=per_ar, gain_ms_per_step=per_step, gain_fraction=rel,
        gain_text=fmt_gain(per_ar, per_step, base, ctx.band),
        evidence=evidence, caveats=caveats, confidence=ctx.confidence)]
