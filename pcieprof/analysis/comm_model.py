"""The analytic communication model of one decode step: which collectives a parallel layout must
do, priced with the all-reduce (and P2P) curves of a topology bundle.

The collectives are counted from the card (pcieprof.cards.step, where the counting rules are
written down); this module prices them.

Pricing: the all-reduce curve of the right group size and variant, read by the one rule of
pcieprof.analysis.curves (log-log between measured sizes, the latency floor below, linear in size
above the largest; a price that extrapolates says so in `notes`). Assumed, and said so in the
output: an all-gather of S bytes
costs half an all-reduce of S (a ring all-gather runs n-1 of the all-reduce's 2(n-1) steps); an
all-to-all of S bytes in total costs an all-reduce of S/2 (it moves (n-1)/n of S per rank, the
all-reduce 2(n-1)/n); a P2P send is priced from p2p.csv (latency + size / bandwidth) when the
bundle has it, else as a 2-rank all-reduce.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from pcieprof.analysis.curves import Curve, Curves
from pcieprof.analysis.decode_share import decode_shares
from pcieprof.analysis.provenance import part_provenance
from pcieprof.bundle import Bundle
from pcieprof.bundle.attribution import Attribution
from pcieprof.bundle.rows import DecodeCurveRow
from pcieprof.cards import ModelCard
from pcieprof.cards.step import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, P2P, Collective, Layout,
                                 count_collectives)
from pcieprof.errors import BadInput

#: An all-gather of S bytes as a share of an all-reduce of S: the ring's step count (n-1 of
#: 2(n-1) steps), which holds where bandwidth decides; the range for the verdict at both ends is
#: itself assumed: up to 1.0 where latency decides (one launch and hop chain either way).
ALL_GATHER_FACTOR = 0.5
ALL_GATHER_RANGE = (0.5, 1.0)

ASSUMPTIONS = [
    "all-gather of S bytes costs 0.5 x all-reduce(S) (ring: n-1 of the 2(n-1) steps)",
    "all-to-all of S bytes in total costs all-reduce(S/2) (bytes moved per rank)",
    "P2P send: p2p.csv latency + size/bandwidth, else a 2-rank all-reduce of the same size",
    "DP attention gathers with an all-reduce of the global tokens (SGLang SUM_LEN mode, no padding)",
    "no custom all-reduce: every all-reduce priced with the NCCL curve of the bundle",
]


class Pricer:
    """Times of collectives from a topology bundle's all-reduce curves (and its p2p.csv).

    Args:
        bundle: a bundle with allreduce.csv (measured, simulated or imported).
        variant: the all-reduce variant to price with; when the bundle lacks it, the default
            curve (said in `notes`).
        all_gather_factor: an all-gather's time as a share of an all-reduce's of the same
            size (assumed; ALL_GATHER_RANGE).

    Raises:
        BadInput: the bundle has no usable all-reduce rows.
    """

    def __init__(self, bundle: Bundle, variant: str = "default",
                 all_gather_factor: float = ALL_GATHER_FACTOR) -> None:
        self.all_gather_factor = all_gather_factor
        self.curves = Curves(bundle.read_table("allreduce"))
        if not len(self.curves):
            raise BadInput(f"{bundle.path}: no usable all-reduce rows in allreduce.csv",
                           hint="run pcieprof topology (or --backend sim) first")
        self.bundle = bundle
        base = self.curves.default()
        self.variant = variant if any(c.variant == variant for c in self.curves) \
            else (base.variant if base else next(iter(self.curves)).variant)
        self.p2p = bundle.read_table("p2p")
        part = bundle.part("allreduce")
        self.source = part and part.source or bundle.source
        self.backend = part and part.backend or bundle.backend
        self.provenance = part_provenance(bundle.manifest, "allreduce")
        self.notes: list[str] = []
        if self.variant != variant:
            self.notes.append(f"variant {variant!r} not in the bundle; priced with {self.variant!r}")

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def curve(self, nranks: int) -> Curve:
        """The curve priced with for a group of `nranks` (the nearest group size the bundle
        has when it lacks that one, said in `notes`)."""
        n = nranks if any(c.nranks == nranks for c in self.curves) \
            else self.curves.nearest_group(nranks)
        if n != nranks:
            self._note(f"no {nranks}-rank all-reduce in the bundle; priced with the {n}-rank curve")
        found = self.curves.find(variant=self.variant, nranks=n)
        if found is None and self.variant != "default":
            self._note(f"no {n}-rank all-reduce of variant {self.variant!r}; that group priced "
                       f"at NCCL defaults")
        return (found or self.curves.default(nranks=n)
                or next(c for c in self.curves if c.nranks == n))

    def allreduce_us(self, nranks: int, size_bytes: float) -> tuple[float, int]:
        """All-reduce time (us) for `size_bytes` over `nranks`, and the group size priced with."""
        c = self.curve(nranks)
        if not c.covers(size_bytes):
            self._note(f"{c.nranks}-rank all-reduce of {int(size_bytes)} B is outside the measured "
                       f"sizes ({c.min_size}..{c.max_size} B): priced by the curves' "
                       f"extrapolation rule")
        return c.at(size_bytes), c.nranks

    def p2p_us(self, size_bytes: float) -> tuple[float, str]:
        p = self.p2p
        if not p.empty:
            ok = p[(p["status"] == "ok") & (p["path"] == "p2p") & (p["direction"] == "uni")]
            lat = ok["latency_us"].dropna()
            bw = ok["bandwidth_gbps"].dropna()
            if len(lat) and len(bw):
                return float(lat.median() + size_bytes / (bw.median() * 1e3)), "p2p.csv"
        t, _ = self.allreduce_us(2, size_bytes)
        return t, "allreduce.csv 2-rank"

    def price(self, c: Collective) -> dict[str, Any]:
        if c.op == ALL_REDUCE:
            t, n = self.allreduce_us(c.group_size, c.size_bytes)
            how = f"all-reduce {n} ranks"
        elif c.op == ALL_GATHER:
            t, n = self.allreduce_us(c.group_size, c.size_bytes)
            f = self.all_gather_factor
            t, how = f * t, f"{f:g} x all-reduce {n} ranks (assumed)"
        elif c.op == ALL_TO_ALL:
            t, n = self.allreduce_us(c.group_size, c.size_bytes / 2)
            how = f"all-reduce of S/2, {n} ranks (assumed)"
        else:
            t, how = self.p2p_us(c.size_bytes)
        return {**asdict(c), "time_us_each": t, "time_us": t * c.count, "priced_with": how}


def predict_step_comm(card: ModelCard, layout: Layout, batch: int, pricer: Pricer) -> dict[str, Any]:
    """Predicted communication time of one decode step (us), collective by collective.

    Args:
        card: the model.
        layout: the parallel layout.
        batch: requests decoding together.
        pricer: the topology bundle's curves (`Pricer(bundle, layout.variant)`).

    Returns:
        {"total_us", "n_collectives", "collectives": [...], "by_op": {op: us}, "source",
         "backend", "variant", "notes", "assumptions", ...}.
    """
    rows = [pricer.price(c) for c in count_collectives(card, layout, batch)]
    by_op: dict[str, float] = {}
    for r in rows:
        by_op[r["op"]] = by_op.get(r["op"], 0.0) + r["time_us"]
    return {
        "model": card.name, "layout": asdict(layout), "layout_label": layout.label(),
        "batch": batch, "total_us": float(sum(r["time_us"] for r in rows)),
        "n_collectives": int(sum(r["count"] for r in rows)), "by_op": by_op, "collectives": rows,
        "source": pricer.source, "backend": pricer.backend,
        "topology_bundle": str(pricer.bundle.path), "variant": pricer.variant,
        "notes": list(pricer.notes), "assumptions": ASSUMPTIONS,
    }


# -- comparing the model with measurements -------------------------------------------------------

def measured_decode_steps(serve_bundle: Bundle | None) -> dict[int, float]:
    """Batch size -> measured decode step time (ms) from serve/decode_curve.csv (ok rows)."""
    if serve_bundle is None:
        return {}
    steps: dict[int, list[float]] = {}
    for r in serve_bundle.rows(DecodeCurveRow):
        if r.status == "ok" and r.step_time_ms == r.step_time_ms:
            steps.setdefault(int(r.batch_size), []).append(float(r.step_time_ms))
    return {b: float(np.median(v)) for b, v in sorted(steps.items())}


def trace_decode_comm(attribution: Attribution | None) -> dict[int, dict[str, float]]:
    """Batch size -> a DECODE step's comm/exposed/span (ms) as traced: attribution.json's saved
    per-batch shares (pcieprof.analysis.decode_share), computed anew for a file that lacks them."""
    if attribution is None:
        return {}
    shares = attribution.decode_share_by_batch or decode_shares(attribution.steps)[1]
    return {int(d.batch): {"comm_ms": d.comm_us / 1e3, "exposed_comm_ms": d.exposed_comm_us / 1e3,
                           "span_ms": d.span_us / 1e3}
            for d in shares if d.batch is not None}


def comparison_table(card: ModelCard, layout: Layout, batches: list[int], pricer: Pricer,
                     serve_bundle: Bundle | None = None,
                     attribution: Attribution | None = None) -> list[dict[str, Any]]:
    """Per batch size: measured step, predicted comm, trace comm, exposed comm, disagreement.

    measured_step_ms comes from serve/decode_curve.csv, else from the trace's DECODE step spans;
    compute_share = 1 - predicted comm / measured step; disagreement_pct = (trace comm -
    predicted) / predicted x 100, empty where either is missing.
    """
    measured = measured_decode_steps(serve_bundle)
    traced = trace_decode_comm(attribution)
    rows = []
    for b in batches:
        p = predict_step_comm(card, layout, b, pricer)
        pred_ms = p["total_us"] / 1e3
        t = traced.get(b, {})
        step = measured.get(b, t.get("span_ms"))
        step_from = "decode_curve.csv" if b in measured else ("trace" if t else None)
        trace_ms = t.get("comm_ms")
        rows.append({
            "model": card.name, "layout": layout.label(), "batch": b,
            "n_collectives": p["n_collectives"], "measured_step_ms": step,
            "measured_step_from": step_from, "predicted_comm_ms": pred_ms,
            "predicted_comm_share_pct": 100 * pred_ms / step if step else None,
            "compute_share_pct": 100 * (1 - pred_ms / step) if step else None,
            "trace_comm_ms": trace_ms, "exposed_comm_ms": t.get("exposed_comm_ms"),
            "disagreement_pct": 100 * (trace_ms - pred_ms) / pred_ms if trace_ms is not None and pred_ms else None,
            "priced_source": p["source"], "priced_backend": p["backend"], "variant": p["variant"],
            "notes": "; ".join(p["notes"]),
        })
    return rows
