"""What a rule sees (RuleContext) and what it returns (Recommendation)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import pandas as pd

from pcieprof.bundle import Bundle
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.curves import Curve
from pcieprof.analysis.infer import InferredTopology
from pcieprof.tune.ring import Ring

#: A difference smaller than this (relative) is within measurement spread: no recommendation.
MIN_GAIN = 0.05


@dataclass
class Recommendation:
    """One change (or one warning) with its evidence and its expected gain.

    Attributes:
        rule: the rule module that made it.
        title: one line.
        kind: `env` (NCCL/SGLang environment), `launch` (CUDA_VISIBLE_DEVICES, files),
            `host` (kernel/BIOS/hypervisor settings), `warn` (a problem without a setting),
            `info` (what the stack does anyway).
        env: environment variables to set.
        action: the exact lines to apply (shell), if any.
        gain_us_per_allreduce: {batch: us saved per decode all-reduce}, from the bundle's curves.
        gain_ms_per_step: {batch: ms saved per decode step} (all-reduces per step x the above).
        gain_fraction: relative improvement of what the rule changes (at decode sizes), or None.
        gain_text: one line for people.
        evidence: what in the bundle supports it (numbers with units and provenance).
        caveats: what it costs elsewhere, what was assumed.
        confidence: `measured` (the setting itself was measured in this bundle), `predicted`
            (from a model of this bundle's numbers), `simulated`, `advice` (no number).
        priority: ordering key (larger first).
    """

    rule: str
    title: str
    kind: str
    env: dict[str, str] = field(default_factory=dict)
    action: str = ""
    gain_us_per_allreduce: dict[int, float] = field(default_factory=dict)
    gain_ms_per_step: dict[int, float] = field(default_factory=dict)
    gain_fraction: float | None = None
    gain_text: str = ""
    evidence: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    confidence: str = "measured"
    priority: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gain_us_per_allreduce"] = {str(k): v for k, v in self.gain_us_per_allreduce.items()}
        d["gain_ms_per_step"] = {str(k): v for k, v in self.gain_ms_per_step.items()}
        return d


@dataclass
class RuleContext:
    """Everything the rules read, computed once from one bundle.

    Attributes:
        bundle: the bundle.
        topology: topology.json (or {}).
        p2p: p2p table; allreduce: allreduce table.
        curves: every all-reduce curve (tune.curves).
        choices: nccl_choices.json (or {}).
        inferred: the inferred hierarchy (or None).
        ring: the best ring (or None without a P2P matrix).
        nccl_ring: the ring NCCL used by default, scored on the same matrices (or None).
        band: decode message band.
        collectives_per_step: batch -> all-reduces per decode step over the full group.
        provenance: "measured, backend cuda" etc. of the all-reduce part.
        needs_measuring: rules append what would have to be measured to decide.
        serve_log: server logs joined (for what SGLang printed), or "".
    """

    bundle: Bundle
    topology: dict[str, Any]
    p2p: pd.DataFrame
    allreduce: pd.DataFrame
    curves: list[Curve]
    choices: dict[str, Any]
    inferred: InferredTopology | None
    ring: Ring | None
    nccl_ring: Ring | None
    band: DecodeBand
    collectives_per_step: Callable[[int], int]
    provenance: str
    needs_measuring: list[str] = field(default_factory=list)
    serve_log: str = ""
    nccl_ring_known: bool = False

    @property
    def ar_backend(self) -> str:
        bs = {c.backend for c in self.curves}
        return bs.pop() if len(bs) == 1 else ("mixed" if bs else "none")

    @property
    def nccl_measured(self) -> bool:
        """True when the all-reduce rows come from NCCL (cuda), a model of it (sim) or an import
        of NCCL's output; gloo (cpu backend) reads no NCCL_* variable."""
        return self.ar_backend in ("cuda", "sim", "imported")

    @property
    def confidence(self) -> str:
        """`simulated` for sim bundles, else `measured`."""
        return "simulated" if self.ar_backend == "sim" else "measured"

    def default_choices(self) -> dict[str, Any]:
        """NCCL's parsed choices (nccl_choices.json) for the default variant over the full group."""
        best: dict[str, Any] = {}
        for entry in (self.choices or {}).values():
            if not isinstance(entry, dict) or (entry.get("env") or {}):
                continue
            parsed = entry.get("parsed") or {}
            if parsed and len(entry.get("ranks") or []) >= len(best.get("_ranks") or []):
                best = {**parsed, "_ranks": entry.get("ranks") or []}
        return best

    def chosen_protocols(self) -> dict[str, list[int]]:
        """Protocol NCCL's tuner picked per all-reduce size inside the decode band: {proto: sizes}."""
        out: dict[str, list[int]] = {}
        for t in self.default_choices().get("tuner") or []:
            if str(t.get("coll", "")).lower() != "allreduce":
                continue
            size = int(t.get("bytes") or 0)
            if self.band.lo_bytes <= size <= self.band.hi_bytes:
                out.setdefault(str(t.get("proto")), []).append(size)
        return out

    def decode_batches(self) -> list[int]:
        return [b for b in (1, 8, 32, 64) if self.band.batch_min <= b <= self.band.batch_max]

    def gains(self, base: Curve, new: Curve) -> tuple[dict[int, float], dict[int, float], float]:
        """Per batch: us saved per all-reduce, ms saved per step; and the mean relative gain."""
        per_ar, per_step, rel = {}, {}, []
        top = min(base.max_size, new.max_size)
        for b in self.decode_batches():
            size = self.band.message_bytes(b)
            if size > top:  # no extrapolation above the measured sizes (below: the latency floor)
                continue
            t0, t1 = base.at(size), new.at(size)
            if not (math.isfinite(t0) and math.isfinite(t1)):
                continue
            per_ar[b] = t0 - t1
            per_step[b] = (t0 - t1) * self.collectives_per_step(b) / 1e3
            rel.append((t0 - t1) / t0 if t0 > 0 else 0.0)
        return per_ar, per_step, (sum(rel) / len(rel) if rel else 0.0)


def priority_of(per_step: dict[int, float], rel: float, weight: float = 1.0) -> float:
    """Ordering key: mean ms saved per decode step over the band (when collectives are counted),
    else the relative gain; `weight` scales rules whose gain is partly off the decode path."""
    vals = [v for v in per_step.values() if math.isfinite(v)]
    if vals and any(vals):
        return weight * 10.0 * sum(vals) / len(vals)
    return weight * 100.0 * rel


def fmt_gain(per_ar: dict[int, float], per_step: dict[int, float], base: Curve | None = None,
             band: DecodeBand | None = None) -> str:
    """'-21 us per all-reduce at batch 1 (48 -> 27 us), -3.3 ms per decode step' style text."""
    if not per_ar:
        return ""
    b0 = min(per_ar)
    parts = [f"{-per_ar[b0]:+.1f} us per all-reduce at batch {b0}"]
    if base is not None and band is not None:
        t0 = base.at(band.message_bytes(b0))
        parts[-1] += f" ({t0:.1f} -> {t0 - per_ar[b0]:.1f} us)"
    if per_step.get(b0) and math.isfinite(per_step[b0]):
        parts.append(f"{-per_step[b0]:+.2f} ms per decode step")
    b1 = max(per_ar)
    if b1 != b0:
        parts.append(f"{-per_ar[b1]:+.1f} us at batch {b1}")
    return ", ".join(parts)
