"""The fabric as the measurements show it: NVLink islands, PCIe levels, pairs without P2P.

Reads the inferred hierarchy (pcieprof.analysis.infer). Pairs without P2P are the finding that
changes a layout: a tensor-parallel group that spans them runs its all-reduce partly through
host memory (NCCL's SHM transport), at the staged-copy rate, however fast the other pairs are.
Real case: the A100 VM of ../shared/samples/tool-outputs-more, NVLink bridge pairs 0,1 and 2,3
(275 GB/s) and no peer access between the pairs (21.5 GB/s through host memory).
"""

from __future__ import annotations

from pcieprof.analysis.infer import NO_P2P, NVLINK, InferredTopology, Level, value_text
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.nccl_defaults import p2p_default_note
from pcieprof.tune.rules.base import RuleContext


def _groups(lv: Level) -> str:
    return " | ".join(",".join(map(str, g)) for g in lv.groups if len(g) > 1) or "none"


def _pairs(pairs: list[tuple[int, int]], limit: int = 8) -> str:
    shown = ", ".join(f"{a}-{b}" for a, b in pairs[:limit])
    return shown + (f" and {len(pairs) - limit} more" if len(pairs) > limit else "")


def _summary(t: InferredTopology) -> str:
    parts = []
    for k, lv in enumerate(t.levels):
        where = t.where(k, limit=4).split(" ", 1)[1]
        val = value_text(lv.value, t.unit)
        parts.append(f"{lv.name} {where}" + ("" if val == "not measured" else f" ({val})"))
    return "; ".join(parts)


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    recs = _evaluate(ctx)
    note = p2p_default_note(ctx.topology)
    for r in recs:  # every card about the fabric says what NCCL makes of host-bridge pairs
        if note:
            r.evidence.insert(1, note)  # second: the console shows a card's first two
    return recs


def _evaluate(ctx: RuleContext) -> list[Recommendation]:
    t = ctx.inferred
    if t is None or not t.levels:
        return []
    if not t.measured:
        return [Recommendation(
            rule="p2p_levels", kind="info", priority=0.8, confidence="advice",
            title=f"Not measured; the topology shows {len(t.levels)} level(s): {_summary(t)}",
            gain_text=("what the driver or the PCIe tree says; how fast each level is, and whether "
                       "P2P works on it, has to be measured"),
            action=("# measure every pair (cuda-samples), or let pcieprof measure and check them:\n"
                    "./p2pBandwidthLatencyTest\npcieprof topology --quick"),
            evidence=list(t.evidence))]
    no_p2p = t.pairs_of(NO_P2P)
    npairs = len(t.gpus) * (len(t.gpus) - 1) // 2
    if no_p2p:
        islands = [lv for lv in t.levels if lv.kind != NO_P2P]
        joined = [g for g in (islands[-1].groups if islands else []) if len(g) > 1]
        over = ", ".join(f"{'NVLink' if lv.kind == NVLINK else 'PCIe'}"
                         f"{'' if len(islands) == 1 else ' ' + _groups(lv)} "
                         f"{value_text(lv.value, t.unit)}" for lv in islands)
        inside = (f"; P2P only within {' | '.join(','.join(map(str, g)) for g in joined)} "
                  f"({over})" if joined else "")
        staged = next(lv for lv in t.levels if lv.kind == NO_P2P)
        n = len(t.gpus)
        return [Recommendation(
            rule="p2p_levels", kind="warn", priority=100, confidence=ctx.confidence,
            title=(f"{len(no_p2p)} of {npairs} GPU pairs have no P2P ({_pairs(no_p2p)}): their "
                   f"traffic goes through host memory"
                   + ("" if staged.value is None else f", {value_text(staged.value, t.unit)}")
                   + inside),
            gain_text=("a tensor-parallel group across these pairs runs its all-reduce through "
                       "host memory (NCCL's SHM transport) at the staged-copy rate"
                       + (f"; groups within {' | '.join(','.join(map(str, g)) for g in joined)} "
                          "keep P2P" if joined else "")),
            action=("# all-reduce inside a P2P group and across the groups (nccl-tests):\n"
                    + (f"CUDA_VISIBLE_DEVICES={','.join(map(str, joined[0]))} "
                       f"all_reduce_perf -b 8 -e 256M -f 2 -g {len(joined[0])}\n" if joined else "")
                    + f"all_reduce_perf -b 8 -e 256M -f 2 -g {n}\n"
                    "# then serve with tensor parallelism inside a P2P group and data or "
                    "pipeline parallelism across"),
            evidence=list(t.evidence),
            caveats=["in a VM the hypervisor decides which peers a guest may map; ask for all "
                     "GPUs in one P2P-capable group if larger TP groups are needed"])]
    nv = [lv for lv in t.levels if lv.kind == NVLINK]
    if nv and len(t.pairs_of(NVLINK)) < npairs:
        return [Recommendation(
            rule="p2p_levels", kind="info", priority=5, confidence=ctx.confidence,
            title=f"NVLink joins only some GPUs: {_summary(t)}",
            gain_text=("a tensor-parallel group inside an NVLink group all-reduces over NVLink; "
                       "one that spans groups runs at the PCIe pairs' rate"),
            evidence=list(t.evidence))]
    if npairs < 2:  # one pair: no structure to state (the direction rules speak for it)
        return []
    what = "one way, the slower direction" if t.unit == "GB/s" else "the slower direction"
    return [Recommendation(
        rule="p2p_levels", kind="info", priority=1, confidence=ctx.confidence,
        title=(f"Every GPU pair has P2P: {_summary(t)}" if len(t.levels) > 1 else
               f"Every GPU pair has P2P, all alike: {value_text(t.levels[0].value, t.unit)} "
               f"per pair ({what})"),
        gain_text=("the levels are what a ring order or layout can exploit" if len(t.levels) > 1
                   else "no pair is faster than another: any ring order and any TP grouping "
                        "see the same links"),
        evidence=list(t.evidence))]
