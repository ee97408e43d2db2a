"""Ring order: the ring through the real fabric, as an NCCL_GRAPH_FILE (and a device order).

Prediction (a model of this bundle's P2P matrices, labelled as such):
- large messages: busbw scales with the ring's effective bottleneck, where a link between two
  inferred switch groups shares the uplink with every other ring link between the same groups
  (a ring crossing twice uses each uplink direction once; crossing four times, twice);
- decode sizes: a ring all-reduce takes 2(n-1) steps, each as slow as the slowest link of the
  ring, so the latency term changes by 2(n-1) x the change of the worst link latency.
When the bundle measured an all-reduce over the recommended order, that measurement is shown.
"""

from __future__ import annotations

import math

import numpy as np

from pcieprof.analysis.infer import InferredTopology
from pcieprof.bundle.rows import format_ranks
from pcieprof.tune.communicators import GRAPH_ENV, SOURCES, covered_layouts
from pcieprof.tune.ring import Ring
from pcieprof.tune.nccl_files import GRAPH_FILE
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import MIN_GAIN, RuleContext, fmt_gain, ranking


def crossings(order: list[int], inferred: InferredTopology | None) -> int:
    """Ring links between different inferred switch groups."""
    if inferred is None:
        return 0
    side = {g: k for k, grp in enumerate(inferred.switch_groups()) for g in grp}
    n = len(order)
    return sum(side.get(order[i]) != side.get(order[(i + 1) % n]) for i in range(n))


def effective_bottleneck(ring: Ring, inferred: InferredTopology | None) -> float:
    """Slowest ring link after dividing cross-switch links by how many share the uplink (GB/s)."""
    if inferred is None:
        return ring.bottleneck_gbps
    side = {g: k for k, grp in enumerate(inferred.switch_groups()) for g in grp}
    share: dict[tuple[int, int], int] = {}
    for a, b, _, _ in ring.links:
        sa, sb = side.get(a), side.get(b)
        if sa != sb and sa is not None and sb is not None:
            key = (min(sa, sb), max(sa, sb))
            share[key] = share.get(key, 0) + 1
    eff = math.inf
    for a, b, bw, _ in ring.links:
        sa, sb = side.get(a), side.get(b)
        k = 1
        if sa != sb and sa is not None and sb is not None:
            k = max(1, math.ceil(share[(min(sa, sb), max(sa, sb))] / 2))
        eff = min(eff, bw / k)
    return eff


def worst_latency(ring: Ring) -> float:
    lats = [l for _, _, _, l in ring.links]
    return max(lats) if lats else float("nan")


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    ring, old = ctx.ring, ctx.nccl_ring
    if ring is None or old is None or len(ring.order) < 3:
        # a ring order needs 3 GPUs: a box known to hold fewer has nothing to measure for it
        few = 0 < len(ctx.topology.gpus) < 3
        if ring is None and ctx.p2p[ctx.p2p["path"] == "p2p"].empty and not few:
            ctx.needs_measuring.append("P2P bandwidth/latency between every GPU pair (for the ring search)")
        return []
    n = len(ring.order)
    e_new, e_old = effective_bottleneck(ring, ctx.inferred), effective_bottleneck(old, ctx.inferred)
    big_gain = e_new / e_old - 1 if e_old > 0 else 0.0
    dlat = worst_latency(old) - worst_latency(ring)
    per_ar: dict[int, float] = {}
    per_step: dict[int, float] = {}
    if np.isfinite(dlat) and dlat > 0:
        for b in ctx.band.batches:
            per_ar[b] = 2 * (n - 1) * dlat
            per_step[b] = per_ar[b] * ctx.collectives_per_step(b) / 1e3
    base = ctx.curves.default()
    rel_decode = 0.0
    if base is not None and per_ar:
        b0 = min(per_ar)
        rel_decode = per_ar[b0] / base.at(ctx.band.message_bytes(b0))
    measured = ctx.curves.find(ranks=tuple(ring.order))
    ev = [f"ring search over p2p.csv ({'exhaustive' if ring.exact else f'heuristic, gap <= {ring.gap * 100:.1f}%'}): "
          f"{' -> '.join(map(str, ring.order))}, slowest link {ring.bottleneck_gbps:.1f} GB/s, "
          f"{crossings(ring.order, ctx.inferred)} switch crossing(s) [{ctx.provenance}]",
          f"NCCL's ring{'' if ctx.nccl_ring_known else ' (assumed: device order, no NCCL log with rings)'}: "
          f"{' -> '.join(map(str, old.order))}, slowest link {old.bottleneck_gbps:.1f} GB/s, "
          f"{crossings(old.order, ctx.inferred)} switch crossing(s)"]
    confidence = "predicted"
    text_parts = []
    if measured is not None and base is not None and measured.ranks != base.ranks:
        m_ar, m_step, m_rel = ctx.gains(base, measured)
        per_ar, per_step, rel_decode = m_ar, m_step, m_rel
        confidence = ctx.confidence
        ev.append(f"allreduce.csv: {ctx.obtained} over the recommended order "
                  f"{format_ranks(measured.ranks)} vs {format_ranks(base.ranks)} (variant {measured.variant})")
        mb = measured.busbw_at(base.max_size) / base.busbw_at(base.max_size) - 1
        text_parts.append(f"{ctx.obtained}: {fmt_gain(m_ar, m_step, base, ctx.band)}; busbw at large "
                          f"sizes {mb * 100:+.0f}% (predicted {big_gain * 100:+.0f}%)")
    if max(big_gain, rel_decode) < MIN_GAIN and confidence == "predicted":
        return []
    if not text_parts:
        text_parts.append(f"predicted: large-message busbw {big_gain * 100:+.0f}% "
                          f"(effective bottleneck {e_old:.1f} -> {e_new:.1f} GB/s)")
        if per_ar:
            text_parts.append(fmt_gain(per_ar, per_step))
    path = ctx.bundle.path / GRAPH_FILE
    ok, not_ok = covered_layouts(set(ring.order))
    only = f"for {', '.join(ok)} only" if ok else "for no layout SGLang starts here"
    return [Recommendation(
        rule="ring_order", kind="launch",
        env={GRAPH_ENV: str(path)},
        # CUDA_VISIBLE_DEVICES in ring order is no alternative: it only renumbers the ranks,
        # and NCCL searches its rings over the same GPUs as before
        action=(f"export {GRAPH_ENV}={path}"
                + ("" if ctx.bundle.has(GRAPH_FILE) else "   # written by: pcieprof recommend BUNDLE")),
        title=f"Run NCCL's ring along the real switches (graph file with the searched ring; "
              f"{only})",
        gain_us_per_allreduce=per_ar, gain_ms_per_step=per_step,
        gain_fraction=max(big_gain, rel_decode), gain_text="; ".join(text_parts),
        **ranking(per_step, max(rel_decode, 0.3 * big_gain)), evidence=ev, confidence=confidence,
        caveats=[f"NCCL reads the file in every communicator, SGLang's sub-groups included, and "
                 f"a communicator lacking a GPU the file names does not start ('XML Import "
                 f"Channel : dev N not found'): it covers the layouts whose every communicator "
                 f"spans GPUs {format_ranks(tuple(sorted(ring.order)))} ({', '.join(ok) or 'none'})"
                 + (f", not {', '.join(not_ok)}, whose commands leave it out" if not_ok else "")
                 + f" [{'; '.join(SOURCES)}]",
                 f"verify on the box: pcieprof topology --ring-order {ring.cuda_visible_devices()} "
                 "(measures the default variant over this order next to the plain one)"])]
