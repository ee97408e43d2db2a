"""Run the tuner on one bundle: context, rules, ring files, layout advice, the principal bottleneck.

`recommend(bundle)` returns a Result; `write_outputs(bundle, result)` stores it in the bundle:
`recommendations.json`, `tune/nccl_graph.xml`, `tune/nccl_topo.xml`, `tune/recommended.env` and
`tune/sglang_command.sh`.
"""

from __future__ import annotations

import importlib
import math
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pcieprof.bundle import Bundle
from pcieprof.report.decode_band import DecodeBand, band_for
from pcieprof.tune import curves as C
from pcieprof.tune.infer import infer
from pcieprof.tune.matrices import gpu_indices, pair_matrix
from pcieprof.tune.nccl_files import graph_xml, topo_xml
from pcieprof.tune.ring import best_ring, ring_of_order
from pcieprof.tune.rules import RULES
from pcieprof.tune.rules.base import Recommendation, RuleContext

GRAPH_FILE = "tune/nccl_graph.xml"
TOPO_FILE = "tune/nccl_topo.xml"
ENV_FILE = "tune/recommended.env"
SGLANG_FILE = "tune/sglang_command.sh"


@dataclass
class Result:
    """What the tuner found for one bundle.

    Attributes:
        recommendations: ordered, most valuable first.
        bottleneck: one sentence naming the principal bottleneck.
        needs_measuring: what the data could not decide.
        ring: the best ring as a dict (order, bottleneck_gbps, ...), or None.
        inferred: the inferred hierarchy as a dict, or None.
        layouts: ranked parallel layouts (pcieprof.tune.layout), possibly empty.
        env: the merged environment of all `env`/`launch` recommendations.
        provenance: of the all-reduce numbers used.
        model: the model card name used for decode sizes and layouts.
    """

    recommendations: list[Recommendation]
    bottleneck: str
    needs_measuring: list[str]
    ring: dict[str, Any] | None
    inferred: dict[str, Any] | None
    layouts: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    provenance: str = ""
    model: str = ""

    def as_dict(self) -> dict[str, Any]:
        return _finite({"format": "pcieprof.recommendations/1", "model": self.model,
                "bottleneck": self.bottleneck, "provenance": self.provenance,
                "recommendations": [r.as_dict() for r in self.recommendations],
                "needs_measuring": self.needs_measuring, "ring": self.ring,
                "inferred": self.inferred, "layouts": self.layouts, "env": self.env})


def _finite(obj: Any) -> Any:
    """JSON has no inf/NaN: store them as null (e.g. the gap of a ring whose bottleneck is 0)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _card(model: str) -> Any:
    try:
        from pcieprof.serve.cards import load_card

        return load_card(model)
    except Exception:  # no card: per-step gains are left out, not invented
        return None


def collectives_counter(card: Any, nranks: int) -> Callable[[int], int]:
    """batch -> number of all-reduces over `nranks` in one decode step (pcieprof.analysis.comm_model)."""
    if card is None or nranks < 2:
        return lambda b: 0
    from pcieprof.analysis.comm_model import Layout, count_collectives

    def count(batch: int) -> int:
        return sum(c.count for c in count_collectives(card, Layout(tp=nranks), batch)
                   if c.op == "all_reduce" and c.group_size == nranks)
    return count


def _nccl_ring(choices: dict[str, Any]) -> list[int] | None:
    """The default variant's channel-0 ring from nccl_choices.json, in GPU indices."""
    for entry in (choices or {}).values():
        if not isinstance(entry, dict) or entry.get("env") or entry.get("variant") not in (None, "default"):
            continue
        parsed = entry.get("parsed") or {}
        rings = parsed.get("rings") or {}
        ranks = entry.get("ranks") or []
        if rings and ranks:
            ring = next(iter(rings.values()))
            try:
                return [int(ranks[r]) for r in ring]
            except (IndexError, TypeError, ValueError):
                return None
    return None


def build_context(bundle: Bundle, band: DecodeBand) -> RuleContext:
    """Read the bundle once and compute what every rule needs."""
    from pcieprof.report.model import BundleView

    view = BundleView(bundle=bundle, label=bundle.path.name)
    topo = bundle.read_json("topology.json", {}) or {}
    p2p = bundle.read_table("p2p")
    ar = bundle.read_table("allreduce")
    cs = C.curves(ar)
    choices = bundle.read_json("nccl_choices.json", {}) or {}
    inferred = infer(p2p, ar, topo)
    ring = old = None
    known = False
    gpus = gpu_indices(p2p)
    if len(gpus) >= 3:
        bw = pair_matrix(p2p, path="p2p", metric="bandwidth_gbps", gpus=gpus)
        lat = pair_matrix(p2p, path="p2p", metric="latency_us", gpus=gpus)
        if not np.isnan(bw).all():
            ring = best_ring(bw, lat, gpus)
            nccl = _nccl_ring(choices)
            known = nccl is not None and sorted(nccl) == sorted(gpus)
            old = ring_of_order(nccl if nccl is not None and known else list(gpus), bw, lat, gpus)
    nranks = max((c.nranks for c in cs), default=len(gpus))
    serve_log = ""
    serve_dir = bundle.path / "serve"
    if serve_dir.is_dir():
        for f in sorted(serve_dir.glob("server-*.log"))[:4]:
            serve_log += f.read_text(encoding="utf-8", errors="replace")[-200_000:]
    prov = view.provenance("allreduce", ar) if not ar.empty else view.provenance("p2p", p2p)
    return RuleContext(bundle=bundle, topology=topo, p2p=p2p, allreduce=ar, curves=cs,
                       choices=choices, inferred=inferred, ring=ring, nccl_ring=old, band=band,
                       collectives_per_step=collectives_counter(_card(band.model), nranks),
                       provenance=prov, serve_log=serve_log, nccl_ring_known=known)


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
    p = ctx.p2p
    if not p[(p["path"] == "p2p") & p["status"].isin(["error", "hang"])].empty:
        return "P2P between GPUs is broken (copies fail or return wrong data)"
    ar = ctx.allreduce
    hung = ar[(ar["status"].isin(["hang", "error"])) & (ar["variant"] == "default")]
    if not hung.empty:
        r = hung.iloc[0]
        return (f"NCCL's default all-reduce {r['status']}s (size {int(r['size_bytes'])} B, ranks "
                f"{r['ranks']}): nothing can be served with the default settings [{ctx.provenance}]")
    lonely = _gpus_without_p2p(ctx)
    if lonely:
        return (f"GPU {', '.join(map(str, lonely))} has no working P2P with the other GPUs "
                f"(no P2P bandwidth measured or supported): NCCL moves its traffic through host "
                f"memory [{ctx.provenance}]")
    base = C.find(ctx.curves, {})
    if base is not None and ctx.ar_backend == "cpu":
        return (f"none named: this bundle measured the harness on this machine's CPUs (gloo "
                f"all-reduce {base.at(ctx.band.lo_bytes):.0f} us at {ctx.band.lo_bytes >> 10} KiB "
                f"over {base.nranks} processes), not GPUs; run on GPUs or with --backend sim")
    if base is not None and not math.isfinite(base.at(ctx.band.lo_bytes)):
        return (f"not named at decode sizes: the all-reduce was measured only from "
                f"{int(base.time_us.index.min()) >> 10} KiB up ({base.nranks} ranks, busbw "
                f"{float(base.busbw_gbps.iloc[-1]):.1f} GB/s at the largest size) "
                f"[{ctx.provenance}]; measure 8 B..1 MiB to see decode latency")
    if base is not None:
        b = ctx.decode_batches()[0] if ctx.decode_batches() else 1
        size = ctx.band.message_bytes(b)
        t = base.at(size)
        n = ctx.collectives_per_step(b)
        what = (f"all-reduce latency at decode sizes: {t:.1f} us per {base.nranks}-GPU "
                f"all-reduce of {size >> 10} KiB")
        if n:
            what += f", x {n} per decode step = {t * n / 1e3:.1f} ms per token at batch {b}"
        virt = (ctx.topology.get("virtualization") or {})
        iommu = (ctx.topology.get("iommu") or {})
        why = []
        if virt.get("is_vm"):
            why.append("a VM")
        if iommu.get("mode") == "translated":
            why.append("IOMMU translating peer DMA")
        if ctx.inferred is not None and ctx.inferred.hidden_structure:
            why.append("a flat virtual PCIe tree hiding the switches from NCCL")
        if why:
            what += f" ({', '.join(why)})"
        return what + f" [{ctx.provenance}]"
    if ctx.ring is not None:
        return (f"slowest P2P link {ctx.ring.bottleneck_gbps:.1f} GB/s between GPU groups "
                f"[{ctx.provenance}]; all-reduce not measured")
    return "not enough measured to name a bottleneck (no P2P matrix, no all-reduce sweep)"


def recommend(bundle: Bundle | str, *, model: str | None = None, batch_max: int = 64,
              layouts: bool = True, context: int = 8192, write_files: bool = True) -> Result:
    """Run every rule on a bundle (and the layout advisor) and rank the results.

    Args:
        bundle: the bundle (or its path).
        model: model card for message sizes and layouts (default glm5-nvfp4).
        batch_max: largest decode batch considered.
        layouts: also rank parallel layouts (needs a model card and all-reduce rows).
        context: tokens per request for the layouts' KV-cache fit.
        write_files: write the NCCL graph/topology files into the bundle (the ring and topo
            recommendations name them); False leaves the bundle untouched.
    """
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
    band = band_for(model, 1, batch_max)
    ctx = build_context(b, band)
    recs: list[Recommendation] = []
    for name in RULES:
        mod = importlib.import_module(f"pcieprof.tune.rules.{name}")
        if write_files and name == "topo_file" and ctx.inferred is not None \
                and ctx.inferred.hidden_structure:
            _write_nccl_files(ctx)
        recs.extend(mod.evaluate(ctx))
    recs.sort(key=lambda r: -r.priority)
    if write_files and ctx.ring is not None:
        _write_nccl_files(ctx)
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
            + "): each setting was measured on its own; their gains need not add up")
    ranked: list[dict[str, Any]] = []
    if layouts and ctx.ar_backend == "cpu":
        ctx.needs_measuring.append("parallel layouts: the all-reduce rows are gloo on this "
                                   "machine's CPUs (cpu backend); layout advice needs NCCL "
                                   "curves (cuda), an import, or --backend sim")
    elif layouts:
        try:
            from pcieprof.tune.layout import rank_layouts

            ranked = rank_layouts(b, band.model, env=env, context=context)
        except Exception as exc:  # layout advice must not hide the NCCL rules
            ctx.needs_measuring.append(f"parallel layouts not ranked: {exc}")
    layout_rec = layout_recommendation(ranked, _card(band.model))
    if layout_rec is not None:
        recs.append(layout_rec)
        recs.sort(key=lambda r: -r.priority)
    return Result(recommendations=recs, bottleneck=principal_bottleneck(ctx, recs),
                  needs_measuring=list(dict.fromkeys(ctx.needs_measuring)),
                  ring=None if ctx.ring is None else {
                      "order": ctx.ring.order, "bottleneck_gbps": ctx.ring.bottleneck_gbps,
                      "latency_sum_us": None if math.isnan(ctx.ring.latency_sum_us) else ctx.ring.latency_sum_us,
                      "exact": ctx.ring.exact, "gap": ctx.ring.gap,
                      "cuda_visible_devices": ctx.ring.cuda_visible_devices()},
                  inferred=None if ctx.inferred is None else ctx.inferred.as_dict(),
                  layouts=ranked, env=env, provenance=ctx.provenance, model=band.model)


def _peak(layout: dict[str, Any]) -> tuple[float, int]:
    """(highest predicted tok/s within memory, at which concurrency)."""
    fit = [r for r in layout["per_concurrency"] if r["fits"] and r["tok_s"] == r["tok_s"]]
    if not fit:
        return 0.0, 0
    best = max(fit, key=lambda r: r["tok_s"])
    return float(best["tok_s"]), int(best["concurrency"])


def layout_recommendation(layouts: list[dict[str, Any]], card: Any) -> Recommendation | None:
    """A recommendation when the best-ranked layout beats the card's default TP layout."""
    if not layouts or card is None:
        return None
    default_tp = int(getattr(card.sglang, "tp_default", 0) or 0)
    base = next((l for l in layouts if l["tp"] == default_tp and l["pp"] == 1 and l["ep"] == 1
                 and not l["dp_attention"] and l["replicas"] == 1), None)
    top = layouts[0]
    if base is None or top is base or not top["fits"]:
        return None
    t_top, c_top = _peak(top)
    t_base, c_base = _peak(base)
    if t_base <= 0 or t_top / t_base - 1 < 0.05:
        return None
    gain = t_top / t_base - 1
    return Recommendation(
        rule="layout", kind="launch", title=f"Serve {card.name} as {top['label']} instead of {base['label']}",
        action=top["command"], env={},
        gain_fraction=gain,
        gain_text=(f"predicted peak {t_top:.0f} tok/s at concurrency {c_top} vs {t_base:.0f} at "
                   f"{c_base} ({gain * 100:+.0f}%) within GPU memory at {top['context_tokens']} "
                   f"tokens of context"),
        evidence=[top.get("why", ""), f"compute: {top.get('compute_source')}",
                  f"communication: {top.get('comm_source')}"],
        caveats=list(top.get("notes", []))[:4], confidence="predicted",
        priority=10.0 * gain)


def _write_nccl_files(ctx: RuleContext) -> None:
    if ctx.ring is None:
        return
    try:
        _write_nccl_files_unchecked(ctx)
    except OSError as exc:
        from pcieprof.errors import BadInput

        raise BadInput(f"cannot write NCCL files into {ctx.bundle.path}: {exc.strerror or exc}",
                       hint="copy the bundle somewhere writable") from None


def _write_nccl_files_unchecked(ctx: RuleContext) -> None:
    assert ctx.ring is not None  # callers write the files only when a ring was found
    ctx.bundle.write_text(GRAPH_FILE, graph_xml(ctx.ring, inferred=ctx.inferred))
    if ctx.inferred is not None and len(ctx.inferred.levels) > 1 and ctx.topology.get("gpus"):
        try:
            ctx.bundle.write_text(TOPO_FILE, topo_xml(ctx.inferred, ctx.topology))
        except ValueError:
            pass


def env_file_text(result: Result) -> str:
    """The recommended environment as a sourceable file, each line with its reason."""
    lines = ["# pcieprof recommend: environment supported by this bundle's measurements",
             f"# numbers: {result.provenance}"]
    for r in result.recommendations:
        if r.kind in ("env", "launch") and r.env:
            lines.append(f"# {r.title} ({r.gain_text})")
            for k, v in r.env.items():
                if result.env.get(k) == v:
                    lines.append(f"export {k}={shlex.quote(v)}")
    if len(lines) == 2:
        lines.append("# nothing to set: no setting beat the default in the measurements")
    return "\n".join(lines) + "\n"


def sglang_command_text(result: Result) -> str:
    """The SGLang launch of the top-ranked layout with the recommended environment."""
    lines = ["#!/bin/sh", "# pcieprof recommend: SGLang launch for the top-ranked layout",
             f"# numbers: {result.provenance}"]
    env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in result.env.items())
    if result.layouts:
        top = result.layouts[0]
        lines.append(f"# layout: {top['label']} ({top.get('why', '')})")
        for k, v in (top.get("env") or {}).items():
            if k not in result.env:
                env_prefix += f" {k}={shlex.quote(str(v))}"
        lines.append(f"{env_prefix} {top['command']}".strip())
    else:
        lines.append("# no layout ranked (no model card or no all-reduce measurements)")
    return "\n".join(lines) + "\n"


def write_outputs(bundle: Bundle, result: Result) -> dict[str, str]:
    """Store the result in the bundle; returns {what: path}."""
    bundle.write_json("recommendations.json", result.as_dict())
    bundle.write_text(ENV_FILE, env_file_text(result))
    bundle.write_text(SGLANG_FILE, sglang_command_text(result))
    bundle.set_part("recommendations", "ok", source=bundle.source, backend=bundle.backend,
                    count=len(result.recommendations))
    out = {"recommendations": str(bundle.path / "recommendations.json"),
           "env": str(bundle.path / ENV_FILE), "sglang": str(bundle.path / SGLANG_FILE)}
    for name in (GRAPH_FILE, TOPO_FILE):
        if bundle.has(name):
            out[name.split("/")[-1]] = str(bundle.path / name)
    return out
