"""Scalar metrics of a bundle, with names stable enough for `pcieprof compare --fail-if`.

Names (units in the name, as in the tables):
  p2p.<path>.bandwidth_gbps.median|min      P2P / host-staged uni bandwidth over all pairs
  p2p.<path>.latency_us.median|max          small-copy latency over all pairs
  allreduce.<variant>.n<N>.time_us@<size>   time at the decode band's sizes (hidden 6144: 12KiB, 96KiB,
                                            384KiB, 768KiB), measured or interpolated only
  allreduce.<variant>.n<N>.busbw_gbps@max   busbw at the largest measured size
  allreduce.<variant>.g<r-r-..>.*           the same for a sub-group (pairs, TP4 groups)
  allreduce.<variant>.order_<r-r-..>.*      the full group in another ring order
  allreduce.<variant>.<K>x<N>.*             a multi-node bundle's group over all K nodes x N
                                            GPUs (its node 0's own N GPUs: n<N>, as on one box)
  serve.<run label>.<metric>[.stat]         serve/summary.json runs (e.g. serve.c=4.tpot_ms.median)
  serve.decode.bs<B>.step_time_ms           the fixed-batch decode curve
  attribution.decode.<stat>                 DECODE-step means of attribution.json, averaged over
                                            ranks (mean_span_us, mean_comm_us, ...)
`higher_is_better` tells compare which way is a regression.
"""

from __future__ import annotations

import math
from typing import Any

from pcieprof.analysis.curves import Curves
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.bundle.attribution import Attribution
from pcieprof.bundle.rows import DecodeCurveRow
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.units import size_label


def _flatten(prefix: str, obj: Any, out: dict[str, float], depth: int = 0) -> None:
    if depth > 4:
        return
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        if math.isfinite(float(obj)):
            out[prefix] = float(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}", v, out, depth + 1)


def bundle_metrics(bundle: Bundle, band: DecodeBand) -> dict[str, float]:
    """All scalar metrics of one bundle (absent parts give no names)."""
    out: dict[str, float] = {}
    p2p = bundle.read_table("p2p")
    for path in ("p2p", "host_staged", "h2d", "d2h"):
        rows = p2p[(p2p["path"] == path) & (p2p["status"] == "ok")]
        bw = rows[(rows["direction"] == "uni")]["bandwidth_gbps"].dropna()
        lat = rows["latency_us"].dropna()
        if len(bw):
            out[f"p2p.{path}.bandwidth_gbps.median"] = float(bw.median())
            out[f"p2p.{path}.bandwidth_gbps.min"] = float(bw.min())
        if len(lat):
            out[f"p2p.{path}.latency_us.median"] = float(lat.median())
            out[f"p2p.{path}.latency_us.max"] = float(lat.max())
    bad = p2p[p2p["status"].isin(["error", "hang"])]
    if not p2p.empty:
        out["p2p.bad_rows"] = float(len(bad))
    cs = Curves(bundle.read_table("allreduce"))
    nodes = bundle.nodes()
    for c in cs:
        dashed = "-".join(map(str, c.ranks))
        if nodes is not None and nodes.spans_nodes(c.ranks) and c.nranks == cs.max_nranks:
            key = (f"allreduce.{c.variant}.{nodes.nnodes}x{c.nranks // nodes.nnodes}"
                   if c.plain_order else f"allreduce.{c.variant}.order_{dashed}")
        elif nodes is not None and not nodes.spans_nodes(c.ranks) and c.plain_order and \
                c.nranks == nodes.per_node:  # node 0's own GPUs: comparable with one box
            key = f"allreduce.{c.variant}.n{c.nranks}"
        elif c.nranks < cs.max_nranks:  # a sub-group: pairs, TP4 groups
            key = f"allreduce.{c.variant}.g{dashed}"
        elif not c.plain_order:  # the full group in another ring order
            key = f"allreduce.{c.variant}.order_{dashed}"
        else:
            key = f"allreduce.{c.variant}.n{c.nranks}"
        for b in band.batches:
            size = band.message_bytes(b)
            if c.covers(size):  # a metric is never an extrapolation
                out[f"{key}.time_us@{size_label(size).replace(' ', '')}"] = c.at(size)
        out[f"{key}.busbw_gbps@max"] = float(c.busbw_gbps.iloc[-1])
    summary = bundle.read_doc(ServeSummary)
    if summary is not None:
        for run in summary.runs:
            for k in ("request_throughput", "output_throughput", "ttft_ms", "tpot_ms",
                      "itl_ms", "e2el_ms", "failed"):
                _flatten(f"serve.{run.label}.{k}", getattr(run, k), out)
    for row in bundle.rows(DecodeCurveRow):
        if row.status == "ok" and row.step_time_ms == row.step_time_ms:
            out[f"serve.decode.bs{row.batch_size}.step_time_ms"] = float(row.step_time_ms)
    attribution = bundle.read_doc(Attribution)
    if attribution is not None:
        decode = [r.decode_steps for r in attribution.ranks if r.decode_steps]
        for k in sorted({k for d in decode for k in d if k.startswith("mean_")}):
            vals = [float(v) for d in decode if (v := d.get(k)) is not None]
            if vals:
                out[f"attribution.decode.{k}"] = sum(vals) / len(vals)
    return out


def higher_is_better(name: str) -> bool:
    """Direction of a metric: bandwidths and throughputs up, times and latencies down."""
    n = name.lower()
    if any(k in n for k in ("gbps", "throughput", "tok_s", "tokens_per_s")):
        return True
    return False
