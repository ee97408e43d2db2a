"""Scalar metrics of a bundle, with names stable enough for `pcieprof compare --fail-if`.

Names (units in the name, as in the tables):
  p2p.<path>.bandwidth_gbps.median|min      P2P / host-staged uni bandwidth over all pairs
  p2p.<path>.latency_us.median|max          small-copy latency over all pairs
  allreduce.<variant>.n<N>.time_us@<size>   time at a decode size (12KiB, 96KiB, 384KiB, 768KiB)
  allreduce.<variant>.n<N>.busbw_gbps@max   busbw at the largest measured size
  allreduce.<variant>.g<r-r-..>.*           the same for a sub-group (pairs, TP4 groups)
  allreduce.<variant>.order_<r-r-..>.*      the full group in another ring order
  serve.<run label>.<metric>[.stat]         serve/summary.json runs (e.g. serve.c=4.tpot_ms.median)
  serve.decode.bs<B>.step_time_ms           the fixed-batch decode curve
  attribution.<key path>                    every number in attribution.json "summary" (flattened)
`higher_is_better` tells compare which way is a regression.
"""

from __future__ import annotations

import math
from typing import Any

from pcieprof.bundle import Bundle
from pcieprof.analysis.decode_band import DecodeBand, band_for
from pcieprof.report.figures import size_label
from pcieprof.analysis import curves as C

_BATCHES = (1, 8, 32, 64)


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


def bundle_metrics(bundle: Bundle, band: DecodeBand | None = None) -> dict[str, float]:
    """All scalar metrics of one bundle (absent parts give no names)."""
    band = band or band_for()
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
    cs = C.curves(bundle.read_table("allreduce"))
    nmax = max((c.nranks for c in cs), default=0)
    for c in cs:
        dashed = c.ranks.replace(",", "-")
        if c.nranks < nmax:  # a sub-group: pairs, TP4 groups
            key = f"allreduce.{c.variant}.g{dashed}"
        elif c.ranks != ",".join(str(i) for i in range(c.nranks)):  # the full group in a ring order
            key = f"allreduce.{c.variant}.order_{dashed}"
        else:
            key = f"allreduce.{c.variant}.n{c.nranks}"
        for b in _BATCHES:
            size = band.message_bytes(b)
            if size <= c.max_size:
                out[f"{key}.time_us@{size_label(size).replace(' ', '')}"] = c.at(size)
        out[f"{key}.busbw_gbps@max"] = float(c.busbw_gbps.iloc[-1])
    summary = bundle.read_json("serve/summary.json", None)
    if isinstance(summary, dict):
        for run in summary.get("runs") or []:
            if isinstance(run, dict) and run.get("label"):
                for k in ("request_throughput", "output_throughput", "ttft_ms", "tpot_ms",
                          "itl_ms", "e2el_ms", "failed"):
                    _flatten(f"serve.{run['label']}.{k}", run.get(k), out)
        for row in summary.get("decode_curve") or []:
            if isinstance(row, dict) and row.get("batch_size") and row.get("step_time_ms"):
                out[f"serve.decode.bs{row['batch_size']}.step_time_ms"] = float(row["step_time_ms"])
    attribution = bundle.read_json("attribution.json", None)
    if isinstance(attribution, dict):
        _flatten("attribution", attribution.get("summary", {}), out)
    return out


def higher_is_better(name: str) -> bool:
    """Direction of a metric: bandwidths and throughputs up, times and latencies down."""
    n = name.lower()
    if any(k in n for k in ("gbps", "throughput", "tok_s", "tokens_per_s")):
        return True
    return False
