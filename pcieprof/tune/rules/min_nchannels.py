"""NCCL_MIN_NCHANNELS: more ring channels when NCCL's search stopped at too few.

Known case (../shared/calibration/README.md): dual Turin, NCCL picked 2 channels; at least 8 raised
large-message busbw from 22.2 to 37.6 GB/s.
"""

from __future__ import annotations

from pcieprof.units import size_label
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import MIN_GAIN, RuleContext, ranking


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    if not ctx.nccl_measured:
        return []
    base = ctx.curves.default()
    if base is None:
        return []
    cands = [c for c in ctx.curves.full_group() if set(c.env) == {"NCCL_MIN_NCHANNELS"}]
    if not cands:
        ctx.needs_measuring.append("all-reduce with NCCL_MIN_NCHANNELS=8 (large-message busbw "
                                   "when NCCL picks few channels)")
        return []
    big = base.max_size
    best = max(cands, key=lambda c: c.busbw_at(big))
    b0, b1 = base.busbw_at(big), best.busbw_at(big)
    rel = (b1 - b0) / b0 if b0 > 0 else 0.0
    per_ar, per_step, drel = ctx.gains(base, best)
    if rel < MIN_GAIN or drel < -MIN_GAIN:
        return []
    n = best.env["NCCL_MIN_NCHANNELS"]
    return [Recommendation(
        rule="min_nchannels", kind="env", env={"NCCL_MIN_NCHANNELS": n},
        action=f"export NCCL_MIN_NCHANNELS={n}", **ranking(per_step, 0.3 * rel, 0.3),
        title=f"Give NCCL at least {n} channels for large all-reduces",
        gain_fraction=rel, gain_us_per_allreduce=per_ar, gain_ms_per_step=per_step,
        gain_text=(f"busbw at {size_label(big)} {b0:.1f} -> {b1:.1f} GB/s ({rel * 100:+.0f}%, "
                   f"prefill and large batches); decode sizes "
                   + (f"{abs(drel) * 100:.0f}% {'faster' if drel > 0 else 'slower'}"
                      if abs(drel) >= 0.01 else "unchanged")),
        evidence=[f"allreduce.csv: variant {best.variant} vs {base.variant} over {base.nranks} "
                  f"ranks [{ctx.provenance}]"]
                 + ([f"nccl_choices.json: NCCL used {ctx.default_nchannels()} channel(s) "
                     f"by default"] if ctx.default_nchannels() else []),
        confidence=ctx.confidence)]
