"""Whether a concurrent copy measurement really ran its flows at once: how its streams were
released (concurrent.csv `release`, `held`), the measured start skew and the bound on the
anchors it is timed from (`start_skew_us`, `release_to_anchor_us_max`), and how much of the
measurement's span every flow was running.

Definitions, from the probe (probes/p2p_worker.py, probes/host_flag.py, docs/probes.md):
- released together: the streams were held by one release until the host had queued every copy
  (`held=yes`), by the host flag (one host write every GPU waits on) or by the gate event (one
  event the other streams wait for). Not together: the hold ended first (`held=no`: the times
  include host queueing), or nothing held (`barrier`, the cpu backend: each process starts its
  flows' threads after one barrier). Not recorded: older bundles, imports, sim rows.
- start skew: how long after the earliest flow's first copy the latest flow's started, each
  timed from its own GPU's anchor. Anchors of different GPUs lie within `lag bound` of the host's
  write (host flag), so the true skew is within the bound of the measured one; with the gate
  event the anchors are assumed simultaneous (no bound).
- overlap: the share of the span (first start to last end, the span the aggregate bandwidth
  divides by) during which every flow was copying; a flow's end is its start plus its bytes
  over its own rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pcieprof.bundle import Bundle
from pcieprof.bundle.rows import ConcurrentRow


def _number(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


@dataclass(frozen=True)
class Release:
    """How one concurrent measurement (a pattern, op and size: its flows and aggregate) started.

    Attributes:
        release: host_flag | gate_event | barrier, "" when not recorded.
        held: the streams were still held when every copy was queued (None: not recorded or
            nothing held).
        together: released together (see the module doc); None when not recorded, and for a
            single flow (nothing to start together).
        start_skew_us: the latest flow's start after the earliest's, microseconds.
        lag_bound_us: the largest bound on a GPU's anchor after the host's write, microseconds
            (host flag only).
        span_us: first start to last end, microseconds.
        overlap: share of `span_us` with every flow copying, 0..1.
    """

    backend: str
    pattern: str
    op: str
    size_bytes: int
    flows: int
    release: str
    held: bool | None
    together: bool | None
    start_skew_us: float | None
    lag_bound_us: float | None
    span_us: float | None
    overlap: float | None

    @property
    def name(self) -> str:
        """`ring/write`, as the report and the console name a measurement."""
        return f"{self.pattern}/{self.op}"

    def how(self) -> str:
        """The release in words (one table cell)."""
        if self.flows == 1:
            return "one flow: nothing to start together"
        if self.backend == "sim":
            return "modelled: every flow priced as running at once"
        if not self.release:
            return "not recorded"
        if self.release == "barrier":
            return "not held: each process starts its flows' threads after a barrier"
        what = "host flag" if self.release == "host_flag" else "gate event"
        if self.held is False:
            return f"{what}: the hold ended before every copy was queued"
        if self.held is None and self.together is None:
            return f"{what}: whether the hold lasted is not recorded"
        if self.release == "gate_event":
            return "gate event: anchors of different GPUs assumed simultaneous"
        if self.lag_bound_us is None:
            return "host flag: an acknowledgement was not seen (anchors not bounded)"
        return "host flag"

    def together_text(self) -> str:
        """yes | no | not recorded (| one flow, modelled)."""
        if self.flows == 1:
            return "one flow"
        if self.backend == "sim" and self.together is None:
            return "modelled"
        return {True: "yes", False: "no", None: "not recorded"}[self.together]


def _measurement(flows: list[ConcurrentRow], agg: ConcurrentRow) -> Release:
    held = {"yes": True, "no": False}.get(agg.held)
    lag = _number(agg.release_to_anchor_us_max)
    together: bool | None = None
    if len(flows) == 1:
        pass
    elif agg.release == "barrier" or held is False:
        together = False
    elif agg.release in ("host_flag", "gate_event") and held:
        together = True
    elif agg.release == "host_flag" and lag is not None:
        together = True  # bundles before `held`: a round the flag did not hold records no bound
    skew = _number(agg.start_skew_us)
    span: float | None = None
    overlap: float | None = None
    moved = agg.size_bytes * agg.iters
    timed = [(s, r) for s, r in ((_number(f.start_skew_us), _number(f.bandwidth_gbps))
                                 for f in flows) if s is not None and r is not None and r > 0]
    if flows and moved > 0 and len(timed) == len(flows):
        ends = [s + moved / (r * 1e3) for s, r in timed]  # bytes / (GB/s) in us
        first, last_start = min(s for s, _ in timed), max(s for s, _ in timed)
        span = max(ends) - first
        overlap = max(0.0, min(ends) - last_start) / span if span > 0 else None
    return Release(agg.backend, agg.pattern, agg.op, int(agg.size_bytes), len(flows),
                   agg.release, held, together, skew, lag, span, overlap)


def releases(bundle: Bundle) -> list[Release]:
    """One Release per concurrent measurement whose aggregate is ok, in file order (a
    measurement's flow rows come right before its aggregate, flow=-1)."""
    out: list[Release] = []
    flows: list[ConcurrentRow] = []
    for row in bundle.rows(ConcurrentRow):
        if row.flow != -1:
            flows.append(row)
            continue
        if row.status == "ok" and not math.isnan(row.bandwidth_gbps):
            out.append(_measurement(flows, row))
        flows = []
    return out


def not_together_sentence(rel: list[Release]) -> str:
    """The plain sentence for measurements not released together ("" when there are none)."""
    several = [r for r in rel if r.flows > 1]
    bad = [r for r in several if r.together is False]
    if not bad:
        return ""
    names = ", ".join(dict.fromkeys(r.name for r in bad))
    low = [r.overlap for r in bad if r.overlap is not None]
    ran = (f"; every flow was copying at once for as little as {min(low) * 100:.0f}% of the span"
           if low else "")
    queued = any(r.held is False for r in bad)
    return (f"{len(bad)} of {len(several)} concurrent measurement(s) with several flows were not "
            f"released together ({names}){ran}. Their flows did not all copy for the whole "
            "span, so each flow's rate met less contention than all flows at once would give "
            "(the slowdown they show is a lower bound on contention), and the aggregate divides "
            "all bytes by a span that includes the stagger"
            + ("; where the hold ended early the times also include host queueing." if queued
               else "."))


def summary_line(rel: list[Release]) -> str:
    """The console's one line on the releases ("" without concurrent measurements)."""
    rel = [r for r in rel if r.flows > 1]
    if not rel:
        return ""
    yes = sum(r.together is True for r in rel)
    no = sum(r.together is False for r in rel)
    skews = [r.start_skew_us for r in rel if r.start_skew_us is not None]
    lags = [r.lag_bound_us for r in rel if r.lag_bound_us is not None]
    if yes == 0 and no == 0:
        what = "modelled" if all(r.backend == "sim" for r in rel) else "not recorded"
        return f"concurrent release: {what}"
    parts = [f"{yes} of {len(rel)} (several flows) released together"]
    if no:
        parts.append(f"{no} not: their slowdown is a lower bound on contention")
    if skews:
        parts.append(f"start skew up to {max(skews):.1f} us")
    if lags:
        parts.append(f"anchors within {max(lags):.1f} us of the release")
    return "concurrent release: " + ", ".join(parts)


__all__ = ["Release", "not_together_sentence", "releases", "summary_line"]
