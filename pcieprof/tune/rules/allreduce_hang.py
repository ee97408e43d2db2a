"""NCCL all-reduces that hang or die: which variants work, and what to run with meanwhile.

In the wild NCCL over a broken IOMMU/ACS P2P path hangs on the first all-reduce. The probes kill
such a launch at its deadline and record `status=hang` (or `error` for a dead rank). When the
default hangs and a variant works, the working variant is the way to run now; the host fix is
the iommu_acs rule's.
"""

from __future__ import annotations

import json

from pcieprof.analysis.curves import variant_env
from pcieprof.bundle.rows import format_ranks
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext

BAD = ("hang", "error")


def failing_variants(ctx: RuleContext) -> dict[str, dict]:
    """variant -> {status, size_bytes, ranks, detail, env} of its first failed row."""
    ar = ctx.allreduce
    out: dict[str, dict] = {}
    for r in ar[ar["status"].isin(BAD)].itertuples():
        if r.variant not in out:
            out[str(r.variant)] = {"status": r.status, "size_bytes": int(r.size_bytes),
                                   "ranks": format_ranks(r.ranks), "detail": str(r.detail),
                                   "env": variant_env(r.env)}
    return out


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    bad = failing_variants(ctx)
    if not bad:
        return []
    default_bad = next((v for v, d in bad.items() if d["env"] == {} or v == "default"), None)
    working = [c for c in ctx.curves.full_group() if c.variant not in bad]
    ev = [f"allreduce.csv: variant {v} {d['status']} at {d['size_bytes']} B over ranks "
          f"{d['ranks']}" + (f" ({d['detail'][:160]})" if d["detail"] else "")
          for v, d in sorted(bad.items())]
    if default_bad is None:
        return [Recommendation(
            rule="allreduce_hang", kind="warn", priority=50, confidence=ctx.confidence,
            title=f"Some NCCL settings hang or fail here: do not use {', '.join(sorted(bad))}",
            gain_text="avoids a hang at start-up", evidence=ev)]
    # say what the rows show: a hang, a failure (an error row: a dead rank or wrong data), and
    # which collective (imported nccl-tests name theirs in the variant: imported:all_gather:...)
    statuses = {d["status"] for d in bad.values()}
    verb = ("hangs" if statuses == {"hang"} else "fails" if statuses == {"error"}
            else "hangs or fails")
    colls = {v.split(":")[1] for v in bad if v.startswith("imported:") and v.count(":") == 2}
    what = f"{'/'.join(sorted(colls)).replace('_', '-')}" if colls else "all-reduce"
    # the default hangs: the measured alternative is the working variant of smallest decode time
    alt = None
    if working:
        size = ctx.band.lo_bytes
        timed = [c for c in working if c.at(size) == c.at(size)]
        alt = min(timed, key=lambda c: c.at(size)) if timed else working[0]
    rec = Recommendation(
        rule="allreduce_hang", kind="env" if alt and alt.env else "warn", priority=900,
        confidence=ctx.confidence,
        title=f"NCCL's default {what} {verb} on this box" + (
            f": run with {' '.join(f'{k}={v}' for k, v in alt.env.items())} ({ctx.obtained} to work)"
            if alt and alt.env else ""),
        env=dict(alt.env) if alt else {},
        action="\n".join(f"export {k}={v}" for k, v in (alt.env.items() if alt else [])),
        gain_text=(f"serving starts at all; {alt.variant} {ctx.obtained} {alt.at(ctx.band.lo_bytes):.1f} us "
                   f"at {ctx.band.lo_bytes >> 10} KiB" if alt else
                   "no variant completed: fix the host P2P path first (IOMMU/ACS rule)"),
        evidence=ev + ([f"allreduce.csv: variant {alt.variant} ({json.dumps(alt.env)}) completed "
                        f"every size over {alt.nranks} ranks"] if alt else []),
        caveats=["a hang on P2P usually means the IOMMU/ACS path drops peer traffic: see the "
                 "host rule; re-measure after changing the host"])
    return [rec]
