"""Parallel layout advice: which TP/EP/PP/DP layout serves the model best on this box.

For each candidate (TP8, TP8+EP8, PP2xTP4, PP4xTP2, DP-attention, two TP4 replicas where the
model fits half the GPUs):
- memory per GPU: weights (card groups split over the GPUs that hold them) + KV cache of the
  running requests at the chosen context, against the GPU memory x SGLang's --mem-fraction-static;
- decode step time at concurrency 1..64 = compute + communication:
  * communication: pcieprof.analysis.comm_model.predict_step_comm (the analytic decode-communication model)
    priced with this bundle's all-reduce curves for the right group size;
  * compute: a roofline on bytes read per GPU per step (weights touched + KV read), with an
    effective memory bandwidth and a fixed per-step cost fitted to a decode curve: this bundle's
    serve/decode_curve.csv when it served the same model, else the published points of
    the card's `[decode_anchor]` (their comm priced as the published box paid it: an assumption);
- the SGLang command and its environment, from the `CommandBuilder` the caller passes (the
  commands pass pcieprof.serve.sglang_cmd's; the tuner itself knows no launcher).
Ranked by output tok/s at the highest concurrency that every fitting layout reaches; with no
decode curve to fit compute to, not ranked at all (`not_ranked` says why) and none is launched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from pcieprof.analysis.anchors import published_compute_ms
from pcieprof.analysis.box import GIB, MIB, Box, box_from
from pcieprof.analysis.comm_model import (ALL_GATHER_RANGE, Layout, Pricer, measured_decode_steps,
                                          predict_step_comm)
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import LayoutAdvice, LayoutPoint
from pcieprof.bundle.rows import DecodeCurveRow
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.bundle.topology import Topology
from pcieprof.cards import ModelCard
from pcieprof.errors import BadInput
from pcieprof.tune import memory
from pcieprof.tune.communicators import env_for
from pcieprof.tune.memory import Placement
from pcieprof.tune.nccl_defaults import two_rank_note

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Candidate:
    """A layout to evaluate: the analytic model's Layout plus how many replicas share the box."""

    label: str
    tp: int
    pp: int = 1
    ep: int = 1
    dp_attention: bool = False
    dp: int | None = None
    replicas: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas


@dataclass
class LaunchCommand:
    """A server launch for one layout, as the caller's CommandBuilder made it.

    Attributes:
        command: one copy-pasteable shell line ("" when none could be built).
        env: the environment it sets.
        notes: translations, checks, or why there is no command.
    """

    command: str = ""
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


#: (card, layout, recommended environment) -> the launch; see LaunchCommand.
CommandBuilder = Callable[[ModelCard, Candidate, dict[str, str]], LaunchCommand]


#: HF `model_type`s (card.family) whose SGLang 0.5.23 model shards attention over the
#: attention-TP group (`get_parallel().attn_tp_size`), which is what `--attn-dp-size`
#: (formerly `--enable-dp-attention`) narrows: with attention DP on, each attention-DP rank runs
#: the attention of its own requests. Checked in the pinned source
#: (~/.cache/pcieprof/sglang-0.5.23, sglang/srt/models/):
#:   deepseek_v2.py:2051 DeepseekV2/V3/V32ForCausalLM (MLA), glm4_moe.py:1284
#:   GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM) (GLM-5), qwen3_moe.py:502 Qwen3MoeForCausalLM,
#:   gpt_oss.py:391 GptOssForCausalLM: heads split by attn_tp_size.
#: Not listed: llama.py:181 LlamaForCausalLM splits its heads by the full tp_size, so attention
#: DP would not shard its attention differently (no DP-attention layout for Llama-style models).
#: A family not listed gets no DP-attention layout (unknown is not offered).
DP_ATTENTION_FAMILIES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa",
                                   "qwen3_moe", "gpt_oss"})


def candidates(card: ModelCard, ngpus: int) -> list[Candidate]:
    """The layouts of issue 6 that use all `ngpus` GPUs and that SGLang runs for `card`: expert
    parallelism only for a model with routed experts, DP attention only for a family whose
    SGLang model shards attention over the attention-TP group (DP_ATTENTION_FAMILIES)."""
    out = [Candidate(f"TP{ngpus}", tp=ngpus)]
    if card.num_routed_experts > 0:
        out.append(Candidate(f"TP{ngpus}+EP{ngpus}", tp=ngpus, ep=ngpus))
    for pp in (2, 4):
        if ngpus % pp == 0 and ngpus // pp >= 1:
            out.append(Candidate(f"PP{pp}xTP{ngpus // pp}", tp=ngpus // pp, pp=pp))
    if card.family in DP_ATTENTION_FAMILIES:
        out.append(Candidate(f"TP{ngpus} DP-attention{ngpus}", tp=ngpus, dp_attention=True,
                             dp=ngpus))
    if ngpus % 2 == 0:
        out.append(Candidate(f"2 replicas x TP{ngpus // 2}", tp=ngpus // 2, replicas=2))
    return out


def _group_bytes(card: ModelCard, name: str) -> float:
    g = card.weights.get(name)
    return float(g.bytes) if g is not None else 0.0


def placement(c: Candidate) -> Placement:
    """The memory placement (pcieprof.tune.memory) of one replica of a candidate."""
    return Placement(tp=c.tp, pp=c.pp, dp_attention=(c.dp or c.tp) if c.dp_attention else 0)


def weights_per_gpu(card: ModelCard, c: Candidate) -> float:
    """Weight bytes on each GPU of one replica, replicated parts counted on every GPU that
    holds them (pcieprof.tune.memory)."""
    return memory.weights_per_gpu(card, placement(c))


def kv_per_request_per_gpu(card: ModelCard, c: Candidate, context: int) -> float:
    """KV bytes one request of `context` tokens costs on a GPU holding its cache."""
    return memory.kv_per_request(card, placement(c), context)


def requests_per_gpu(c: Candidate, concurrency: int) -> float:
    """Running requests whose KV one GPU holds."""
    per_replica = concurrency / c.replicas
    if c.dp_attention and c.dp:
        return per_replica / c.dp
    return per_replica


def bytes_read_per_step(card: ModelCard, c: Candidate, batch: float, context: int) -> float:
    """Bytes one GPU reads in one decode step of `batch` requests (per replica): the weights it
    touches plus the KV of its requests. Routed experts: the expected number of distinct experts
    the batch selects, E x (1 - (1 - k/E)^(batch)); DSA attention reads at most index_topk
    tokens of KV per request (an approximation: the indexer keys of all tokens are not added)."""
    routed = _group_bytes(card, "routed_experts")
    attn = _group_bytes(card, "attention")
    other = float(card.weight_bytes) - routed - attn
    shards = c.tp * c.pp
    e, k = max(1, int(card.num_routed_experts or 1)), max(1, int(card.experts_per_token or 1))
    touched = e * (1 - (1 - k / e) ** max(batch, 1)) if card.num_routed_experts else e
    w = other / shards + routed * (touched / e) / shards
    if c.dp_attention and c.dp:
        w += attn / (max(1, c.tp // c.dp) * c.pp)
        reqs = batch / c.dp
    else:
        w += attn / shards
        reqs = batch
    topk = getattr(card.attention, "index_topk", None) or context
    kv = reqs * card.kv_bytes_per_token_per_gpu(c.tp, c.pp) * min(context, topk)
    return w + kv


@dataclass
class ComputeModel:
    """step_compute_ms = bytes / (eff_gbps * 1e6) + fixed_ms, fitted to a decode curve."""

    eff_gbps: float
    fixed_ms: float
    source: str
    points: list[tuple[int, float, float]]  # (batch, measured step ms, comm ms subtracted)
    layout: str = ""  # the layout the anchor ran (`TP8`), whose points these are

    def compute_ms(self, nbytes: float) -> float:
        return nbytes / (self.eff_gbps * 1e6) + self.fixed_ms


@dataclass(frozen=True)
class Anchor:
    """A decode curve the compute roofline is fitted to.

    Attributes:
        steps: batch -> step time (ms).
        source: where it comes from.
        tp: the TP size it ran at.
        context_tokens: tokens of context per request.
        comm_ms: batch -> the communication (ms) to subtract, priced for the box and settings
            the anchor ran with; None: the anchor ran on this bundle's box (price it with the
            bundle's curves).
        comm_ms_high: the same at the assumption's high end (None: no range).
        comm_note: how `comm_ms` was priced (an assumption, shown with the layouts).
    """

    steps: dict[int, float]
    source: str
    tp: int
    context_tokens: int
    comm_ms: dict[int, float] | None = None
    comm_ms_high: dict[int, float] | None = None
    comm_note: str = ""


def anchor_curve(bundle: Bundle, card: ModelCard) -> Anchor | None:
    """The decode curve for `card`: this bundle's serve/decode_curve.csv when it served the same
    model (its communication priced with this bundle's curves: the same box), else the published
    points with the communication of the published box (the card's `[decode_anchor]`)."""
    summary = bundle.read_doc(ServeSummary)
    if summary is not None and summary.model == card.name:
        steps = measured_decode_steps(bundle)
        if steps:
            # the short decode-curve requests: prompt + output tokens of context
            ctx = max((r.input_len + r.output_len for r in bundle.rows(DecodeCurveRow)), default=0)
            return Anchor(steps, f"serve/decode_curve.csv of this bundle [{bundle.source}]",
                          summary.tp or card.sglang.tp_default, ctx)
    a = card.decode_anchor
    if not a:
        return None
    steps = {int(c): c / tps * 1000.0 for c, tps in a["points"]}
    comm = {int(b): float(ms) for b, ms in a.get("comm_ms", [])} or None
    high = {int(b): float(ms) for b, ms in a.get("comm_ms_default", [])} or None
    env = " ".join(f"{k}={v}" for k, v in a.get("comm_env", {}).items())
    note = (f"its communication priced as on the published box (assumed: fabric model "
            f"{a.get('comm_profile', '?')}, {env or 'NCCL defaults'})") if comm else ""
    return Anchor(steps, f"published: {a['source']} (imported)", int(a["tp"]),
                  int(a["context_tokens"]), comm, high, note)


def fit_compute(card: ModelCard, pricer: Pricer, bundle: Bundle,
                high: bool = False) -> ComputeModel | None:
    """Fit the roofline's bandwidth and fixed cost to the anchor decode curve (least squares),
    its communication subtracted as the anchor's own box paid it (`high`: at the high end of that
    assumption; None when the anchor has no range)."""
    anchor = anchor_curve(bundle, card)
    if anchor is None or not anchor.steps or anchor.tp < 1:
        return None
    own = anchor.comm_ms_high if high else anchor.comm_ms
    if high and own is None:
        return None
    tp = anchor.tp
    c = Candidate(f"TP{tp}", tp=tp)
    xs, ys, pts = [], [], []
    for b, ms in sorted(anchor.steps.items()):
        if own is not None and b in own:
            comm = own[b]
        else:
            comm = predict_step_comm(card, Layout(tp=tp), b, pricer)["total_us"] / 1e3 if tp > 1 else 0.0
        xs.append(bytes_read_per_step(card, c, b, max(anchor.context_tokens, 1)))
        ys.append(max(ms - comm, 0.05 * ms))
        pts.append((b, ms, comm))
    X = np.vstack([np.array(xs), np.ones(len(xs))]).T
    if len(xs) >= 2:
        (a, t0), *_ = np.linalg.lstsq(X, np.array(ys), rcond=None)
    else:
        a, t0 = ys[0] / xs[0], 0.0
    if a <= 0:
        a, t0 = float(np.mean(ys) / np.mean(xs)), 0.0
    if t0 < 0:
        a, t0 = float(np.dot(xs, ys) / np.dot(xs, xs)), 0.0
    source = anchor.source + (f"; {anchor.comm_note}" if anchor.comm_note else "")
    if high:
        source += "; at the assumption's high end (NCCL defaults on the published box)"
    return ComputeModel(eff_gbps=1.0 / a / 1e6, fixed_ms=float(t0), source=source, points=pts,
                        layout=c.label)


def gpu_memory(box: Box, card: ModelCard) -> Box:
    """`box` with its GPU memory; where the bundle does not tell it, the memory the card was
    written for, said to be assumed, as a range: the card's nominal size (high end) down to the
    total NVML reports on that GPU after the driver's reservation (`gpu_memory_nvml_mib`, low
    end; a point when the card does not give it)."""
    s = card.sglang
    if box.memory_bytes is not None or s.gpu_memory_gib <= 0:
        # a card made from a config.json names no GPU: the memory stays unknown, not 0 GiB
        return box
    # a card's nominal size is a binary unit (96 GB GDDR7 = 96 GiB, NVML 97887 MiB)
    high = float(s.gpu_memory_gib) * GIB
    low = min(float(s.gpu_memory_nvml_mib) * MIB, high) if s.gpu_memory_nvml_mib > 0 else None
    span = (f"{s.gpu_memory_gib:g} GiB nominal, {low / GIB:.1f} GiB as NVML reports it "
            f"({s.gpu_memory_nvml_mib:g} MiB): range {low / GIB:.1f}-{s.gpu_memory_gib:g} GiB"
            if low is not None else
            f"{s.gpu_memory_gib:g} GiB nominal; the card gives no NVML total, so no range")
    return replace(box, memory_bytes=high, memory_low_bytes=low,
                   memory_source=f"assumed: card {card.name}'s gpu_memory_gib ({span}); "
                                 f"{box.memory_source}")


def rank_layouts(bundle: Bundle, card: ModelCard, pricer: Pricer, *, topology: Topology,
                 env: dict[str, str] | None = None, context: int = 8192, priced_as: str = "",
                 command: CommandBuilder | None = None,
                 graph_gpus: set[int] | None = None) -> list[LayoutAdvice]:
    """Evaluate and rank the candidate layouts for `card` on the bundle's box.

    Args:
        bundle: the bundle (its serve/decode_curve.csv, when it served `card`, fits compute).
        card: the model.
        pricer: the bundle's all-reduce curves, to price communication with.
        topology: the bundle's topology.json (GPU count and memory).
        env: the recommended environment (added to every command).
        context: tokens per request for the KV-cache fit and reads.
        priced_as: how `pricer`'s variant reads in each layout's comm_source (`with variant
            p2p_level_sys (NCCL_P2P_LEVEL=SYS, as the lines set it)`, `at NCCL defaults`).
        command: builds each layout's launch command; None leaves the commands empty.
        graph_gpus: the GPUs the recommended NCCL_GRAPH_FILE names; a layout with a
            communicator it does not cover gets its command without it
            (pcieprof.tune.communicators.env_for).

    Returns:
        The layouts, best first, the first carrying `why`; with no compute anchor for `card`,
        unranked (fitting first, in candidate order, no `why`: see not_ranked).

    Raises:
        BadInput: a box of fewer than 2 GPUs.
    """
    ngpus = len(topology.gpus) or pricer.curves.max_nranks
    if ngpus < 2:
        raise BadInput("layout advice needs a box of at least 2 GPUs")
    compute = fit_compute(card, pricer, bundle)
    box = gpu_memory(box_from(topology, ngpus), card)
    mem, mem_src = float(box.memory_bytes or 0.0), box.memory_source
    frac = memory.mem_fraction(card)
    results = []
    for c in candidates(card, ngpus):
        f = memory.fit(card, placement(c), box, context, frac)
        w, kv_req = f.needs, f.kv_request
        # requests of the whole box whose KV fits: each GPU holds 1/(replicas x DP) of them
        max_c = int(f.requests_per_gpu / requests_per_gpu(c, 1)) if f.requests_per_gpu else 0
        # at the low end of an assumed memory's range (None: the memory is not a range)
        max_c_low = (int(f.requests_low / requests_per_gpu(c, 1)) if f.requests_low else 0
                     ) if f.requests_low is not None else None
        points = []
        notes: list[str] = []
        if f.uncertain:  # offered, as an unchecked fit is, with the range it flips in
            notes.append(f"{c.label}: {f.verdict()}")
        elif f.has is None:
            # neither the bundle nor the card tells the GPU memory: the fit is unknown, not
            # "does not fit" (0 GiB); the layout is offered with what it needs, said unchecked
            max_c = max(CONCURRENCY)
            notes.append(f"{c.label}: {f.verdict()}")
        for conc in CONCURRENCY:
            batch = conc / c.replicas
            b_int = max(1, int(math.ceil(batch)))
            lay = Layout(tp=c.tp, ep=c.ep, pp=c.pp, dp_attention=c.dp_attention, dp=c.dp)
            pred = predict_step_comm(card, lay, b_int, pricer)
            comm_ms = pred["total_us"] / 1e3
            for n in pred["notes"]:
                if n not in notes:
                    notes.append(n)
            if compute is not None:
                comp_ms = compute.compute_ms(bytes_read_per_step(card, c, batch, context)) * c.pp
            else:
                comp_ms = float("nan")
            step = comp_ms + comm_ms
            tok_s = conc / step * 1000 if step == step and step > 0 else float("nan")
            points.append(LayoutPoint(concurrency=conc, batch_per_replica=batch, step_ms=step,
                                      compute_ms=comp_ms, comm_ms=comm_ms, tok_s=tok_s,
                                      fits=conc <= max_c))
        if c.ep > 1:
            notes.append("EP with SGLang's default MoE backend: the MoE output is still reduced "
                         "with an all-reduce (no DeepEP all-to-all assumed); compute as TP, expert "
                         "load imbalance not modelled")
        if c.pp > 1:
            notes.append("PP decode: stages run one after the other for a batch (no micro-batch "
                         "overlap assumed), so compute is summed over stages")
        if c.tp == 2 and (two := two_rank_note(topology)):
            notes.append(two)
        if c.dp_attention:
            notes.append("DP attention: attention weights replicated in each attention group; each "
                         "GPU holds the KV of its own requests only")
        if max_c < 1:  # a layout that does not fit is never offered as a launch
            launch = LaunchCommand(notes=[f"{c.label}: {f.verdict()}"])
        elif command is not None:
            own, left_out = env_for(dict(env or {}), graph_gpus, c.tp, c.pp, c.ep,
                                    (c.dp or 1) if c.dp_attention else 1, c.replicas)
            launch = command(card, c, own)
            launch.notes[:0] = left_out
        else:
            launch = LaunchCommand(
                notes=["no launch command built (the tuner was run without a launcher)"])
        results.append(LayoutAdvice(
            label=c.label, tp=c.tp, pp=c.pp, ep=c.ep, dp_attention=c.dp_attention,
            replicas=c.replicas, fits=max_c >= 1, weights_gib=w / GIB,
            kv_gib_per_request=kv_req / GIB, gpu_memory_gib=mem / GIB, memory_source=mem_src,
            gpu_memory_gib_low=(box.memory_low_bytes / GIB
                                if box.memory_low_bytes is not None else None),
            fit_uncertain=f.uncertain, max_concurrency_low=max_c_low,
            mem_fraction=frac, context_tokens=context, max_concurrency=max_c,
            per_concurrency=points, command=launch.command, env=launch.env,
            notes=notes + launch.notes,
            compute_source=compute.source if compute else "no decode curve: compute not predicted",
            comm_source=f"pcieprof.analysis.comm_model priced with {bundle.path.name}"
                        f"'s all-reduce {priced_as or f'variant {pricer.variant}'}"
                        f" [{pricer.source}]"))

    if compute is None:
        # No compute anchor: a step's communication is known, its compute is not. Ranking on
        # communication alone would put PP first, whose stages add up compute that is not
        # predicted (with the GLM-5 anchor PP4xTP2 is slower than TP8 at c=1:
        # tests/tune/test_tune_layout.py), so the layouts are listed, fitting ones first, in
        # candidate order, and none is chosen (not_ranked says why).
        results.sort(key=lambda r: (r.fits and not r.fit_uncertain, r.fits), reverse=True)
        return results

    def key(r: LayoutAdvice) -> tuple[bool, bool, float, float]:
        best = max((p.tok_s for p in r.per_concurrency
                    if p.fits and p.tok_s is not None and p.tok_s == p.tok_s), default=-1.0)
        lat = r.per_concurrency[0].step_ms
        # a layout that fits at both ends of an assumed memory range ranks above one that fits
        # at its high end only
        return (r.fits and not r.fit_uncertain, r.fits, best,
                -(lat if lat is not None and lat == lat else 1e9))

    results.sort(key=key, reverse=True)
    if results:
        results[0].why = _why(results, compute)
        high = fit_compute(card, pricer, bundle, high=True)
        cand = next(c for c in candidates(card, ngpus) if c.label == results[0].label)
        rng = _at_high_end(card, cand, results[0], high, context)
        if rng:
            results[0].why += "; " + rng
        rng = _all_gather_high_end(card, cand, results[0], Pricer(
            bundle, pricer.variant, all_gather_factor=ALL_GATHER_RANGE[1]))
        if rng:
            results[0].why += "; " + rng
        rng = _memory_low_end(results[0])
        if rng:
            results[0].why += "; " + rng
    return results


def not_ranked(card: ModelCard, layouts: list[LayoutAdvice]) -> str:
    """Why `layouts` (rank_layouts' answer for `card`) are not ranked, or "" when they are: no
    layout has a predicted compute, so there is no tok/s to rank on and no layout to launch."""
    if not layouts or any(p.compute_ms is not None and math.isfinite(p.compute_ms)
                          for lay in layouts for p in lay.per_concurrency):
        return ""
    return (f"not ranked: no compute anchor for {card.name} (no published decode curve, and "
            f"this bundle did not serve it), so no tok/s is predicted and no layout is chosen "
            f"to launch; communication alone would rank PP first, whose stages add up compute "
            f"that is not predicted")


def _memory_low_end(top: LayoutAdvice) -> str:
    """The top layout's peak at the low end of an assumed GPU memory's range, or "" when the
    memory is not a range or its low end keeps the same peak."""
    low, low_gib = top.max_concurrency_low, top.gpu_memory_gib_low
    fit_hi = [p for p in top.per_concurrency if p.fits]
    if low is None or low_gib is None or not top.fits or not fit_hi:
        return ""
    span = f"range of the assumed GPU memory ({top.memory_text()}/GPU)"
    fit_lo = [p for p in fit_hi if p.concurrency <= low]
    if not fit_lo:
        return f"{span}: at {low_gib:.1f} GiB {top.label} does not fit (fit uncertain)"
    hi, lo = fit_hi[-1], fit_lo[-1]
    if lo.concurrency == hi.concurrency:
        return ""

    def tok(p: LayoutPoint) -> str:
        return f"{p.tok_s:.0f} tok/s" if p.tok_s is not None and math.isfinite(p.tok_s) else "-"

    return (f"{span}: at {low_gib:.1f} GiB, {top.label} holds up to c={low}: {tok(lo)} at "
            f"c={lo.concurrency} (not {tok(hi)} at c={hi.concurrency})")


def _all_gather_high_end(card: ModelCard, c: Candidate, top: LayoutAdvice, high: Pricer) -> str:
    """The top layout's c=1 step and peak with every all-gather priced at the high end of
    comm_model's assumed ALL_GATHER_FACTOR (`high`'s factor), or "" when that moves neither."""
    fit_rows = [p for p in top.per_concurrency if p.fits]
    if not top.fits or not fit_rows or c.tp < 2 or any(
            p.compute_ms is None or p.compute_ms != p.compute_ms for p in fit_rows):
        return ""  # no compute predicted: no step to state a range of
    out = []
    for p in (top.per_concurrency[0], fit_rows[-1]):
        lay = Layout(tp=c.tp, ep=c.ep, pp=c.pp, dp_attention=c.dp_attention, dp=c.dp)
        comm = predict_step_comm(card, lay, max(1, int(math.ceil(p.batch_per_replica))),
                                 high)["total_us"] / 1e3
        step = (p.compute_ms or 0.0) + comm
        out.append((p, step, p.concurrency / step * 1000 if step > 0 else float("nan")))
    (p1, s1, _), (pk, _, tk) = out
    (_, sk, _) = out[1]
    if p1.step_ms is None or pk.step_ms is None or max(abs(s1 - p1.step_ms),
                                                       abs(sk - pk.step_ms)) < 0.05:
        return ""  # moves no step by 0.05 ms
    moved = _moved(p1, s1, pk, tk)
    if not moved:
        return ""
    lo, hi = ALL_GATHER_RANGE[0], high.all_gather_factor
    return (f"range of the assumed all-gather cost ({lo:g} x an all-reduce of its size; range "
            f"{lo:g}-{hi:g}, itself assumed): at {hi:g}, {top.label} {moved}")


def _moved(p1: LayoutPoint, s1: float, pk: LayoutPoint, tk: float) -> str:
    """`22.9 ms per step at c=1 (not 22.2), 569 tok/s at c=32 (not 575)`: the c=1 step and the
    peak at an assumption's other end, each only where it differs from the table's value at the
    precision shown ("" when neither does: an empty range says nothing)."""
    parts = []
    if p1.step_ms is not None and f"{s1:.1f}" != f"{p1.step_ms:.1f}":
        parts.append(f"{s1:.1f} ms per step at c={p1.concurrency} (not {p1.step_ms:.1f})")
    if tk == tk and pk.tok_s is not None and f"{tk:.0f}" != f"{pk.tok_s:.0f}":
        parts.append(f"{tk:.0f} tok/s at c={pk.concurrency} (not {pk.tok_s:.0f})")
    return ", ".join(parts)


def _at_high_end(card: ModelCard, c: Candidate, top: LayoutAdvice, high: ComputeModel | None,
                 context: int) -> str:
    """The top layout's c=1 step and peak with the compute fitted at the high end of the anchor's
    assumed communication (the range of the verdict), or ""."""
    fit_rows = [p for p in top.per_concurrency if p.fits]
    if high is None or not top.fits or not fit_rows:
        return ""
    out = []
    for p in (top.per_concurrency[0], fit_rows[-1]):
        comp = high.compute_ms(bytes_read_per_step(card, c, p.batch_per_replica, context)) * c.pp
        step = comp + (p.comm_ms or 0.0)
        out.append((p, step, p.concurrency / step * 1000))
    (p1, s1, _), (pk, _, tk) = out
    moved = _moved(p1, s1, pk, tk)
    return (f"range of the assumed anchor communication (NCCL defaults on the published box): "
            f"{top.label} {moved}") if moved else ""


def _why(results: list[LayoutAdvice], compute: ComputeModel | None) -> str:
    top = results[0]
    fit_rows = [p for p in top.per_concurrency if p.fits]
    if not top.fits or not fit_rows:
        return "no layout fits the GPU memory at this context"
    r = fit_rows[-1]
    if compute is not None:
        parts = [f"{top.label}: {r.tok_s:.0f} tok/s at concurrency {r.concurrency} "
                 f"(step {r.step_ms:.1f} ms = compute {r.compute_ms:.1f} + comm {r.comm_ms:.1f})"]
    else:  # no decode curve: ranked on communication alone, no "nan tok/s" shown
        parts = [f"{top.label}: comm {r.comm_ms:.1f} ms per step at concurrency "
                 f"{r.concurrency} (compute not predicted)"]
    if len(results) > 1:
        # the next layout at its own best concurrency that fits, not at one where it does not
        nxt = results[1]
        ok = [p for p in nxt.per_concurrency if p.fits and (compute is None or (
            p.step_ms is not None and p.step_ms == p.step_ms))]
        if not ok:
            parts.append(f"next {nxt.label}: does not fit the GPU memory at this context")
        elif compute is not None:
            rr = max(ok, key=lambda p: p.tok_s or 0.0)
            parts.append(f"next {nxt.label}: {rr.tok_s:.0f} tok/s at concurrency "
                         f"{rr.concurrency} (step {rr.step_ms:.1f} ms = compute "
                         f"{rr.compute_ms:.1f} + comm {rr.comm_ms:.1f})")
        else:
            rr = next((p for p in ok if p.concurrency == r.concurrency), ok[-1])
            parts.append(f"next {nxt.label}: comm {rr.comm_ms:.1f} ms per step at concurrency "
                         f"{rr.concurrency}")
    parts.append("driven by: " + ("the fitted compute roofline (" + compute.source + ")" if compute
                                  else "communication only (no decode curve)")
                 + ", the model's collective counts priced with this box's curves "
                 + (top.comm_source.split("'s all-reduce ", 1)[1].rsplit(" [", 1)[0]
                    if "'s all-reduce " in top.comm_source else "")
                 + f", and memory fit at {top.context_tokens} tokens")
    one = _one_point(results, compute)
    if one:
        parts.append(one)
    return "; ".join(parts)


def _one_point(results: list[LayoutAdvice], compute: ComputeModel | None) -> str:
    """Why the anchor's layout's c=1 step and the cards' token (pcieprof.analysis.anchors.
    token_share: the anchor's own batch-1 point) differ, where they do at the precision shown;
    "" otherwise."""
    if compute is None:
        return ""
    lay = next((r for r in results if r.label == compute.layout and r.fits), None)
    p1 = lay.per_concurrency[0] if lay is not None and lay.per_concurrency else None
    point = next(((ms, comm) for b, ms, comm in compute.points if b == 1), None)
    if p1 is None or p1.concurrency != 1 or p1.compute_ms is None or p1.step_ms is None \
            or point is None:
        return ""
    own = point[0] - point[1]
    # the layouts price their lines' NCCL settings; the cards' token NCCL's defaults
    variant = lay.comm_source.split("'s all-reduce with ", 1)[1].split(" (", 1)[0] \
        if lay is not None and "'s all-reduce with variant " in lay.comm_source else ""
    if f"{own:.1f}" == f"{p1.compute_ms:.1f}" and not variant:
        return ""
    said = (f"{compute.layout}'s c=1 step ({p1.step_ms:.1f} ms) takes its compute from the "
            f"roofline fitted over all {len(compute.points)} anchor batches "
            f"({p1.compute_ms:.1f} ms); the cards' token times take the anchor's own batch-1 "
            f"point ({own:.1f} ms), so theirs are {abs(p1.compute_ms - own):.1f} ms "
            f"{'shorter' if own < p1.compute_ms else 'longer'}")
    if variant and p1.comm_ms is not None:
        said += (f"; its communication ({p1.comm_ms:.1f} ms) is priced with {variant}, the "
                 f"NCCL settings its line sets, the cards' token at NCCL's defaults")
    return said
