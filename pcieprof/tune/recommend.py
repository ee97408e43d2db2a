"""Run the tuner on one bundle: context, rules, ring files, layout advice, the principal bottleneck.

`recommend(bundle, card)` returns the Recommendations document (pcieprof.bundle.recommendations);
`write_outputs(bundle, doc)` stores it in the bundle: `recommendations.json`,
`tune/nccl_graph.xml`, `tune/nccl_topo.xml`, `tune/recommended.env` and `tune/sglang_command.sh`.
The tuner only reads the bundle: it measures nothing (`recommend --verify` re-measures through the
measurement session, pcieprof.measurement) and launches nothing (the layouts' SGLang commands come
from the CommandBuilder its caller passes).
"""

from __future__ import annotations

import json

import math
import shlex
from typing import Callable

import numpy as np

from pcieprof.analysis.anchors import published_compute_ms
from pcieprof.analysis.comm_model import Layout, Pricer, count_collectives
from pcieprof.analysis.curves import EXTRAPOLATED, Curve, Curves
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.infer import NO_P2P, infer
from pcieprof.analysis.matrices import gpu_indices, link_matrix, pair_matrix, pair_support
from pcieprof.analysis.nodes import Nodes
from pcieprof.analysis.provenance import part_provenance
from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclChoices
from pcieprof.bundle.recommendations import (LayoutAdvice, Recommendation, Recommendations,
                                             RingChoice, ranked)
from pcieprof.bundle.rows import format_ranks
from pcieprof.bundle.topology import Topology
from pcieprof.cards import ModelCard
from pcieprof.errors import BadInput
from pcieprof.tune.launch import BENCH, launch_line, launch_recommendation
from pcieprof.tune.layout import CommandBuilder, not_ranked, rank_layouts
from pcieprof.tune.nccl_files import GRAPH_FILE, TOPO_FILE, write_files
from pcieprof.tune.ring import Ring, best_ring, ring_of_order
from pcieprof.tune.rules import FINDING_RULES, RULES
from pcieprof.tune.rules.base import RuleContext, fixed_rank
from pcieprof.tune.vm_context import bottleneck_why
from pcieprof.tune.assumed import gain_ranges
from pcieprof.tune.workload import TUNER_FILE, on_the_workload, price, slowed
from pcieprof.units import size_label

ENV_FILE = "tune/recommended.env"
SGLANG_FILE = "tune/sglang_command.sh"


def collectives_counter(card: ModelCard, nranks: int) -> Callable[[int], int]:
    """batch -> number of all-reduces over `nranks` in one decode step (the analytic comm model
    at TP = nranks)."""
    if nranks < 2:
        return lambda b: 0

    def count(batch: int) -> int:
        return sum(c.count for c in count_collectives(card, Layout(tp=nranks), batch)
                   if c.op == "all_reduce" and c.group_size == nranks)
    return count


def build_context(bundle: Bundle, card: ModelCard, band: DecodeBand) -> RuleContext:
    """Read the bundle once and compute what every rule needs."""
    topo = bundle.read_doc(Topology) or Topology()
    p2p = bundle.read_table("p2p")
    ar = bundle.read_table("allreduce")
    cs = Curves(ar)
    choices = bundle.read_doc(NcclChoices) or NcclChoices()
    inferred = infer(p2p, ar, topo)
    ring = old = None
    known = False
    needs: list[str] = []
    gpus = gpu_indices(p2p)
    if len(gpus) >= 3:
        # a ring link without P2P runs through host memory (NCCL's SHM), never at 0 GB/s
        bw, _ = link_matrix(p2p, metric="bandwidth_gbps", gpus=gpus)
        lat, _ = link_matrix(p2p, metric="latency_us", gpus=gpus)
        if not np.isnan(bw).all():
            ring = best_ring(bw, lat, gpus)
            case = choices.default_case()
            nccl = case.ring_devices() if case else None
            known = nccl is not None and sorted(nccl) == sorted(gpus)
            old = ring_of_order(nccl if nccl is not None and known else list(gpus), bw, lat, gpus)
            if not ring.bottleneck_gbps > 0:  # no ring closes over measured links
                unmeasured = [f"{a}-{b}" for i, a in enumerate(gpus) for j, b in enumerate(gpus)
                              if i < j and not (bw[i, j] > 0 and bw[j, i] > 0)]
                needs.append("P2P bandwidth of every GPU pair for the ring search (not measured: "
                             + ", ".join(unmeasured[:12]) + ")")
                ring = old = None
    nranks = cs.max_nranks or len(gpus)
    serve_log = ""
    serve_dir = bundle.path / "serve"
    if serve_dir.is_dir():
        for f in sorted(serve_dir.glob("server-*.log"))[:4]:
            serve_log += f.read_text(encoding="utf-8", errors="replace")[-200_000:]
    prov = (part_provenance(bundle.manifest, "allreduce", ar) if not ar.empty
            else part_provenance(bundle.manifest, "p2p", p2p))
    return RuleContext(bundle=bundle, topology=topo, p2p=p2p, allreduce=ar, curves=cs,
                       choices=choices, inferred=inferred, ring=ring, nccl_ring=old, band=band,
                       collectives_per_step=collectives_counter(card, nranks),
                       provenance=prov, serve_log=serve_log, nccl_ring_known=known,
                       needs_measuring=needs)


def _in_token(ctx: RuleContext, batch: int, allreduce_ms: float) -> str:
    """`9.9 ms of all-reduce in a ~22.0 ms token`: the step's all-reduce time, not a token time
    (issue 22), beside the token the cards' shares use (pcieprof.analysis.anchors.token_share:
    the published compute plus this communication) where the model has an anchor."""
    comp = published_compute_ms(ctx.band.model, batch)
    token = f" in a ~{comp + allreduce_ms:.1f} ms token" if comp is not None else " per token"
    return f"{allreduce_ms:.1f} ms of all-reduce{token}"


def _gpus_without_p2p(ctx: RuleContext) -> list[int]:
    """GPUs with no P2P bandwidth to any other GPU while other pairs have some."""
    gpus = gpu_indices(ctx.p2p)
    if len(gpus) < 3:
        return []
    bw = pair_matrix(ctx.p2p, path="p2p", metric="bandwidth_gbps", gpus=gpus)
    if np.isnan(bw).all():
        return []
    alone = [g for i, g in enumerate(gpus)
             if all(not (bw[i, j] > 0) and not (bw[j, i] > 0) for j in range(len(gpus)) if j != i)]
    return alone if len(alone) < len(gpus) else []


def principal_bottleneck(ctx: RuleContext, recs: list[Recommendation]) -> str:
    """One sentence: what limits decode on this box, from the strongest evidence available."""
    nodes = Nodes.of(ctx.bundle)
    if nodes is not None and nodes.layout.node_rank != 0 and ctx.allreduce.empty:
        return (f"not named here: this bundle is node {nodes.layout.node_rank} of a "
                f"{nodes.describe()} run, whose all-reduce rows are in node 0's bundle "
                f"({nodes.layout.collective_rows}); run pcieprof recommend on that bundle")
    p = ctx.p2p
    if not p[(p["path"] == "p2p") & p["status"].isin(["error", "hang"])].empty:
        return "P2P between GPUs is broken (copies fail or return wrong data)"
    ar = ctx.allreduce
    hung = ar[(ar["status"].isin(["hang", "error"])) & (ar["variant"] == "default")]
    if not hung.empty:
        r = hung.iloc[0]
        return (f"NCCL's default all-reduce {r['status']}s (size {int(r['size_bytes'])} B, ranks "
                f"{format_ranks(r['ranks'])}): nothing can be served with the default settings [{ctx.provenance}]")
    lonely = _gpus_without_p2p(ctx)
    if lonely:
        support = pair_support(p)
        alone_why = ("peer access not supported" if all(
            support.get((a, b)) == "not_supported" for a in lonely for b in gpu_indices(p)
            if a != b and (a, b) in support) else f"no P2P bandwidth {ctx.obtained} or supported")
        return (f"GPU {', '.join(map(str, lonely))} has no working P2P with the other GPUs "
                f"({alone_why}): NCCL moves its traffic through host memory [{ctx.provenance}]")
    base = ctx.curves.default()
    # several nodes: name the group as nodes x GPUs, and the intra-node curve beside it
    over = nodes.group(base.ranks) if nodes is not None and base is not None else None
    if base is not None and ctx.ar_backend == "cpu":
        return (f"none named: this bundle measured the harness on this machine's CPUs (gloo "
                f"all-reduce {base.at(ctx.band.lo_bytes):.0f} us at {ctx.band.lo_bytes >> 10} KiB "
                f"over {over or f'{base.nranks} processes'}"
                f"{_intra_node(ctx, nodes, base)}), not GPUs; run on GPUs or with --backend sim")
    if base is not None and base.extent(ctx.band.lo_bytes) == EXTRAPOLATED:
        return (f"not named at decode sizes: the all-reduce was measured only up to "
                f"{size_label(base.max_size)} ({base.nranks} ranks, {base.at(base.max_size):.1f} us "
                f"there) [{ctx.provenance}]; measure up to 1 MiB to see decode latency")
    if base is not None and not math.isfinite(base.at(ctx.band.lo_bytes)):
        return (f"not named at decode sizes: the all-reduce was {ctx.obtained} only from "
                f"{base.min_size >> 10} KiB up ({base.nranks} ranks, busbw "
                f"{float(base.busbw_gbps.iloc[-1]):.1f} GB/s at the largest size) "
                f"[{ctx.provenance}]; measure 8 B..1 MiB to see decode latency")
    if base is not None:
        b = ctx.band.batch_min
        size = ctx.band.lo_bytes
        t = base.at(size)
        n = ctx.collectives_per_step(b)
        what = (f"all-reduce latency at decode sizes: {t:.1f} us per "
                f"{f'all-reduce over {over}' if over else f'{base.nranks}-GPU all-reduce'} of "
                f"{size >> 10} KiB{_intra_node(ctx, nodes, base)}")
        if n:
            what += f", x {n} per decode step = {_in_token(ctx, b, t * n / 1e3)} at batch {b}"
        why = bottleneck_why(ctx)
        if why:
            what += f" ({'; '.join(why)})"
        return what + f" [{ctx.provenance}]"
    finding = next((r for r in recs if r.rule in FINDING_RULES and r.kind == "warn"), None)
    if finding is not None:
        return f"{finding.title} [{ctx.provenance}]; no all-reduce in this bundle"
    if ctx.ring is not None:
        a, b, gbps, _ = min(ctx.ring.links, key=lambda link: link[2])
        how = (" (no P2P: through host memory)" if ctx.inferred is not None
               and ctx.inferred.kind_of(a, b) == NO_P2P else "")
        return (f"slowest ring link {gbps:.1f} GB/s, GPU {a}-{b}{how} [{ctx.provenance}]; "
                f"no all-reduce in this bundle")
    gpus = gpu_indices(p)
    if len(gpus) == 2:
        bw, _ = link_matrix(p, metric="bandwidth_gbps", gpus=gpus)
        if np.isfinite(bw).any():
            return (f"P2P GPU {gpus[0]}->{gpus[1]} {_gbps(bw[0, 1])}, {gpus[1]}->{gpus[0]} "
                    f"{_gbps(bw[1, 0])} [{ctx.provenance}]; no all-reduce in this bundle")
    return ("not enough in this bundle to name a bottleneck (no P2P bandwidth between the GPUs, "
            "no all-reduce sweep)")


def _gbps(v: float) -> str:
    return f"{v:.1f} GB/s" if np.isfinite(v) and v > 0 else "not in this bundle"


def _intra_node(ctx: RuleContext, nodes: Nodes | None, base: Curve) -> str:
    """`; intra-node (2 GPUs of node 0): 40 us, inter-node transport Socket (...)` beside an
    inter-node curve of a multi-node bundle; empty otherwise."""
    if nodes is None or not nodes.layout.spans_nodes(base.ranks):
        return ""
    size = ctx.band.lo_bytes
    inside = [c for c in ctx.curves if c.variant == base.variant
              and not nodes.layout.spans_nodes(c.ranks)]
    inside.sort(key=lambda c: -c.nranks)
    said = (f"; intra-node ({nodes.group(inside[0].ranks).replace(' (intra-node)', '')}): "
            f"{inside[0].at(size):.1f} us" if inside else "")
    return f"{said}; inter-node transport: {nodes.transport}"


def recommend(bundle: Bundle, card: ModelCard, *, band: DecodeBand | None = None,
              layouts: bool = True, context: int = 8192, write_files: bool = True,
              command: CommandBuilder | None = None) -> Recommendations:
    """Run every rule on a bundle (and the layout advisor) and rank the results.

    Args:
        bundle: the bundle.
        card: the model card (message sizes, collectives per step, layouts).
        band: the decode band (default: the card's, batch 1..64).
        layouts: also rank parallel layouts (needs all-reduce rows).
        context: tokens per request for the layouts' KV-cache fit.
        write_files: write the NCCL graph/topology files into the bundle (the ring and topo
            recommendations name them); False leaves the bundle untouched.
        command: builds each layout's launch command (None: layouts without commands).
    """
    band = band or DecodeBand.of_card(card)
    ctx = build_context(bundle, card, band)
    if cpu_only(bundle):
        return _cpu_only(ctx, card)
    if write_files:  # before the rules, whose actions name the files
        _write_nccl_files(ctx)
        ctx.bundle.remove(TUNER_FILE)  # written again below when the tuner route applies
    recs: list[Recommendation] = []
    for evaluate in RULES:
        recs.extend(evaluate(ctx))
    # a global setting is offered only when it slows no phase of the card's workload
    base = ctx.curves.default()
    for r in recs:  # a simulated gain at both ends of each assumed number it rests on
        new = ctx.curves.find(r.env) if r.kind == "env" and r.env else None
        if base is not None and new is not None and new is not base:
            r.caveats.extend(gain_ranges(r, new.variant, base.variant, ctx.topology, band,
                                         ctx.collectives_per_step))
    recs = [on_the_workload(r, band, ctx.collectives_per_step, base,
                            ctx.curves.find(r.env) if r.kind == "env" and r.env else None,
                            bundle=ctx.bundle, write=write_files)
            for r in recs]
    recs = ranked(recs)
    env: dict[str, str] = {}
    for r in recs:
        if r.kind in ("env", "launch"):
            for k, v in r.env.items():
                env.setdefault(k, v)
    measured_env = [r for r in recs if r.kind == "env" and r.env]
    if len(measured_env) > 1:
        ctx.needs_measuring.append(
            "all-reduce with the combined environment (" + " ".join(
                f"{k}={v}" for r in measured_env for k, v in r.env.items())
            + f"): each setting was {ctx.obtained} on its own; their gains need not add up")
    layouts_ranked: list[LayoutAdvice] = []
    if layouts and len(ctx.topology.gpus) == 1:
        pass  # one GPU: no layout to rank, nothing to measure for it
    elif layouts and not len(ctx.curves):
        ctx.needs_measuring.append("parallel layouts not ranked: no all-reduce rows to price "
                                   "communication with")
    elif layouts and not _prices_decode(ctx):
        ctx.needs_measuring.append("parallel layouts not ranked: the all-reduce was not measured "
                                   "at decode sizes (measure 8 B..1 MiB) to price a decode step "
                                   "with")
    elif layouts:
        try:
            variant, said = pricing_variant(ctx, env)
            layouts_ranked = rank_layouts(bundle, card, Pricer(bundle, variant),
                                          topology=ctx.topology, env=env, context=context,
                                          command=command, priced_as=said,
                                          graph_gpus=set(ctx.ring.order) if ctx.ring else None)
        except BadInput as exc:  # e.g. a one-GPU box: the NCCL rules stand on their own
            ctx.needs_measuring.append(f"parallel layouts not ranked: {exc.one_line()}")
    nodes = Nodes.of(bundle)
    if nodes is not None and layouts_ranked:
        ctx.needs_measuring.append(
            f"layouts across nodes: this is a {nodes.describe()} bundle; the layouts above are "
            "for one node's GPUs (priced with its intra-node curve where measured); TP or PP "
            "over the nodes is not ranked")
    unranked = not_ranked(card, layouts_ranked)
    if unranked:
        ctx.needs_measuring.append(
            f"a decode curve of {card.name} on this box (serve-bench's serve/decode_curve.csv "
            f"in this bundle) to fit compute to and rank the parallel layouts")
    layout_rec = layout_recommendation(layouts_ranked, card)
    if layout_rec is not None:
        recs.append(layout_rec)
    for r in recs:  # rules with a fixed ordering key say so on their card
        r.ranked_by = r.ranked_by or fixed_rank(r.priority)
    recs = ranked(recs)
    return Recommendations(model=card.name, bottleneck=principal_bottleneck(ctx, recs),
                           provenance=ctx.provenance, recommendations=recs,
                           priced_env=priced_env(ctx),
                           needs_measuring=list(dict.fromkeys(ctx.needs_measuring)),
                           ring=None if ctx.ring is None else _ring_choice(ctx.ring),
                           inferred=None if ctx.inferred is None else ctx.inferred.as_dict(),
                           layouts=layouts_ranked, layouts_unranked=unranked, env=env)


#: What a bundle of the cpu backend cannot show, and what shows it on a GPU box.
ON_A_GPU_BOX = ("# on the GPU box: GPUs, PCIe tree, P2P per pair and NCCL's all-reduce sweep\n"
                "pcieprof topology\n"
                "pcieprof recommend reports/topology-*/\n"
                "# or import what was run there (nvidia-smi topo -m, p2pBandwidthLatencyTest, "
                "nccl-tests, NCCL debug logs)\n"
                "pcieprof import FILE...")


def cpu_only(bundle: Bundle) -> bool:
    """Whether every P2P and all-reduce row of the bundle comes from the cpu backend (host
    memory copies between local processes, gloo): evidence about this machine's CPUs, of no
    kind that a GPU, P2P or NCCL finding can rest on (issue 22, point 3)."""
    rows = [t for t in (bundle.read_table("p2p"), bundle.read_table("allreduce")) if not t.empty]
    if not rows:
        return bundle.backend == "cpu"
    return all("backend" in t.columns and set(t["backend"].astype(str)) == {"cpu"} for t in rows)


def _cpu_only(ctx: RuleContext, card: ModelCard) -> Recommendations:
    """A cpu-backend bundle: what it measured, and what to run on a GPU box; no advice."""
    said = []
    p2p = ctx.p2p[(ctx.p2p["path"] == "p2p") & (ctx.p2p["status"] == "ok")] \
        if not ctx.p2p.empty else ctx.p2p
    if not p2p.empty:
        bw = p2p["bandwidth_gbps"].dropna()
        if len(bw):
            said.append(f"host-memory copies between {len(gpu_indices(ctx.p2p))} local "
                        f"processes: {bw.median():.1f} GB/s median ({bw.min():.1f}-"
                        f"{bw.max():.1f}) over {len(bw)} rows")
    base = ctx.curves.default()
    if base is not None:
        size = ctx.band.lo_bytes
        said.append(f"gloo all-reduce over {base.nranks} processes: {base.at(size):.0f} us at "
                    f"{size_label(size)}")
    what = "; ".join(said) or "no P2P or all-reduce rows"
    rec = Recommendation(
        rule="cpu_backend", kind="info",
        title="This bundle measured this machine's CPUs (cpu backend), not GPUs: no GPU, P2P or "
              "NCCL advice follows from it",
        gain_text=f"it measured {what}: the harness and this host's memory, with spreads of "
                  f"CPU scheduling, which say nothing about a GPU fabric",
        action=ON_A_GPU_BOX,
        evidence=[f"p2p.csv / allreduce.csv: every row backend cpu [{ctx.provenance}]"],
        confidence="measured", priority=1.0)
    # with an all-reduce or on a node of a multi-node run, principal_bottleneck's cpu wording
    # (which names the nodes, or where node 0's rows are)
    said_by_rows = principal_bottleneck(ctx, []) if base is not None or \
        Nodes.of(ctx.bundle) is not None else ""
    return Recommendations(
        model=card.name, provenance=ctx.provenance, recommendations=[rec],
        bottleneck=said_by_rows or f"none named: this bundle measured the harness on this "
                                   f"machine's CPUs ({what}), not GPUs; run pcieprof topology "
                                   f"on the GPU box, or --backend sim",
        needs_measuring=["GPU P2P, NCCL all-reduce and layouts: measure on the GPU box "
                         "(pcieprof topology) or import its tool outputs (pcieprof import)"])


def pricing_variant(ctx: RuleContext, env: dict[str, str]) -> tuple[str, str]:
    """The all-reduce variant the layouts are priced with: the one run with the most of the
    NCCL settings their launch lines set (the recommended environment), so a line is priced as
    it launches; and how that reads (`NCCL_P2P_LEVEL=SYS, as the lines set it`, or `at NCCL
    defaults` where the bundle ran none of them), naming the settings the variant lacks."""
    base = ctx.curves.default()
    nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    fits = [c for c in ctx.curves if base is not None and c.nranks == base.nranks and c.env
            and all(nccl.get(k) == v for k, v in dict(c.env).items())]
    # among variants of as many of the settings, the one that saves the most at decode sizes:
    # the nearest to the lines' combined environment, which the bundle did not run
    lo = ctx.band.lo_bytes
    best = max(fits, key=lambda c: (len(c.env), -c.at(lo) if c.covers(lo) else -math.inf,
                                    c.plain_order), default=None)
    if best is None:
        return "default", ("at NCCL defaults" + (
            f" (the lines also set {' '.join(f'{k}={v}' for k, v in nccl.items())}, which no "
            f"all-reduce of this bundle ran with)" if nccl else ""))
    lacks = {k: v for k, v in nccl.items() if k not in dict(best.env)}
    return best.variant, (f"with variant {best.variant} ("
                          + " ".join(f"{k}={v}" for k, v in dict(best.env).items())
                          + ", as the lines set it"
                          + (f"; not in it: {' '.join(f'{k}={v}' for k, v in lacks.items())}, "
                             f"not priced together" if lacks else "") + ")")


def priced_env(ctx: RuleContext) -> list[str]:
    """The NCCL settings this bundle ran an all-reduce with, one variable each, that slow no
    phase of the card's workload (pcieprof.tune.workload): what a card's NCCL setting in a
    launch line is checked against (pcieprof.tune.launch.checked_env)."""
    base = ctx.curves.default()
    out: list[str] = []
    if base is None or not ctx.nccl_measured:
        return out
    for c in ctx.curves:
        if len(c.env) == 1 and c.nranks == base.nranks and c is not base:
            (k, v), = dict(c.env).items()
            if not slowed(price(ctx.band, ctx.collectives_per_step, base, c)) \
                    and f"{k}={v}" not in out:
                out.append(f"{k}={v}")
    return out


def _prices_decode(ctx: RuleContext) -> bool:
    """True when the default all-reduce curve covers the decode band's smallest size (measured,
    interpolated or at the latency floor; not extrapolated, not unknown)."""
    base = ctx.curves.default()
    return base is None or base.covers(ctx.band.lo_bytes)


def _ring_choice(ring: Ring) -> RingChoice:
    return RingChoice(order=list(ring.order), bottleneck_gbps=ring.bottleneck_gbps,
                      latency_sum_us=None if math.isnan(ring.latency_sum_us) else ring.latency_sum_us,
                      exact=ring.exact, gap=ring.gap,
                      cuda_visible_devices=ring.cuda_visible_devices())


def layout_recommendation(layouts: list[LayoutAdvice], card: ModelCard) -> Recommendation | None:
    """A recommendation when the best-ranked layout beats the card's default TP layout."""
    if not layouts:
        return None
    default_tp = card.sglang.tp_default
    base = next((lay for lay in layouts if lay.tp == default_tp and lay.pp == 1 and lay.ep == 1
                 and not lay.dp_attention and lay.replicas == 1), None)
    top = layouts[0]
    if base is None or top is base or not top.fits:
        return None
    t_top, c_top = top.peak()
    t_base, c_base = base.peak()
    if t_base <= 0 or t_top / t_base - 1 < 0.05:
        return None
    gain = t_top / t_base - 1
    # memory the bundle does not tell is the card's, a range: the peak rests on it, said so
    within = (f"within the assumed GPU memory ({top.memory_text()}/GPU"
              + (", fit uncertain" if top.fit_uncertain else "") + ")"
              if top.memory_assumed() else "within GPU memory")
    return Recommendation(
        rule="layout", kind="launch", title=f"Serve {card.name} as {top.label} instead of {base.label}",
        action=top.command, env={},
        gain_fraction=gain,
        gain_text=(f"predicted peak {t_top:.0f} tok/s at concurrency {c_top} vs {t_base:.0f} at "
                   f"{c_base} ({gain * 100:+.0f}%) {within} at {top.context_tokens} "
                   f"tokens of context"),
        evidence=[top.why, f"compute: {top.compute_source}", f"communication: {top.comm_source}"],
        caveats=list(top.notes)[:4], confidence="predicted",
        priority=10.0 * gain,
        ranked_by=f"score {10.0 * gain:.1f} = 10 x predicted peak throughput gain, "
                  f"{gain * 100:+.0f}% (each 10% counts as 1 ms of step gain)")


def _write_nccl_files(ctx: RuleContext) -> None:
    if ctx.ring is None:
        return
    try:
        write_files(ctx.bundle, ctx.ring, ctx.inferred, ctx.topology)
    except OSError as exc:
        raise BadInput(f"cannot write NCCL files into {ctx.bundle.path}: {exc.strerror or exc}",
                       hint="copy the bundle somewhere writable") from None


def env_file_text(result: Recommendations) -> str:
    """The recommended environment as a sourceable file, each line with its reason."""
    lines = ["# pcieprof recommend: environment supported by this bundle's measurements",
             f"# numbers: {result.provenance}"]
    for r in result.recommendations:
        if r.kind in ("env", "launch") and r.env:
            lines.append(f"# {r.title} ({r.gain_text})")
            for risk in r.risks:
                lines.append(f"# RISK: {risk.title}; {risk.check}")
                if risk.host_alternative:
                    lines.append(f"# host-side alternative: {risk.host_alternative}")
            for k, v in r.env.items():
                if result.env.get(k) == v:
                    lines.append(f"export {k}={shlex.quote(v)}")
    if len(lines) == 2:
        lines.append("# nothing to set: no setting beat the default in the measurements")
    return "\n".join(lines) + "\n"


def sglang_command_text(result: Recommendations) -> str:
    """The SGLang launch of the top-ranked layout with the recommended environment (none where
    the layouts are not ranked: the script says why)."""
    head = ("no launch: the parallel layouts are not ranked" if result.layouts_unranked
            else "SGLang launch for the top-ranked layout")
    lines = ["#!/bin/sh", f"# pcieprof recommend: {head}",
             f"# numbers: {result.provenance}"]
    for r in result.recommendations:  # a setting that can hang says so where it is launched
        for risk in r.risks if any(result.env.get(k) == v for k, v in r.env.items()) else []:
            lines.append(f"# RISK of {' '.join(f'{k}={v}' for k, v in r.env.items())}: "
                         f"{risk.title}; check it first: pcieprof recommend BUNDLE --verify")
    rec = launch_recommendation(result)
    if result.layouts_unranked:
        lines.append(f"# no layout: parallel layouts {result.layouts_unranked}")
    elif result.layouts:
        top = result.layouts[0]
        lines.append(f"# layout: {top.label} ({top.why})")
    elif rec is None:
        lines.append("# no layout ranked (no model card or no all-reduce measurements)")
    if rec is not None:
        lines.append(f"# launch backends: {rec.gain_text}")
        # the launch recommendation's line is the one checked against the box (tune.launch)
        # the serve-bench command of the same launch (the action's comment line) goes above
        # the line, so the script's last line stays the command
        action = rec.action.splitlines()
        lines += ([a for a in action if a.startswith(BENCH)] + [a for a in action
                  if not a.startswith(BENCH)]) if action else [f"# no launch line: {rec.title}"]
    return "\n".join(lines) + "\n"


def write_outputs(bundle: Bundle, result: Recommendations) -> dict[str, str]:
    """Store the result in the bundle; returns {what: path}."""
    bundle.write_doc(result)
    bundle.write_text(ENV_FILE, env_file_text(result))
    bundle.write_text(SGLANG_FILE, sglang_command_text(result))
    bundle.set_part("recommendations", "ok", source=bundle.source, backend=bundle.backend,
                    count=len(result.recommendations))
    out = {"recommendations": str(bundle.path / Recommendations.FILE),
           "env": str(bundle.path / ENV_FILE), "sglang": str(bundle.path / SGLANG_FILE)}
    # An NCCL file this result does not name (an earlier run's, or written before the rules
    # turned it down) would read as this run's advice: only the files named stay.
    named = "".join((bundle.path / f).read_text() for f in (Recommendations.FILE, ENV_FILE,
                                                            SGLANG_FILE))
    for name in (GRAPH_FILE, TOPO_FILE, TUNER_FILE):
        path = str(bundle.path / name)
        if path not in named and json.dumps(path)[1:-1] not in named:  # as JSON escapes it
            bundle.remove(name)
        elif bundle.has(name):
            out[name.split("/")[-1]] = str(bundle.path / name)
    return out
