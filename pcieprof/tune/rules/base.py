"""What a rule sees (RuleContext) and what it returns (a Recommendation of
pcieprof.bundle.recommendations), and the gain helpers the rules share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from pcieprof.analysis.curves import Curve, Curves
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.infer import InferredTopology
from pcieprof.analysis.provenance import obtained
from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclCase, NcclChoices
from pcieprof.bundle.recommendations import CORRECTNESS, FIXED
from pcieprof.bundle.topology import Topology
from pcieprof.analysis.anchors import token_share
from pcieprof.tune.ring import Ring

#: A difference smaller than this (relative) is within measurement spread: no recommendation.
MIN_GAIN = 0.05


@dataclass
class RuleContext:
    """Everything the rules read, computed once from one bundle.

    Attributes:
        bundle: the bundle.
        topology: topology.json (empty when the bundle has none).
        p2p: p2p table; allreduce: allreduce table.
        curves: every all-reduce curve (pcieprof.analysis.curves).
        choices: nccl_choices.json (empty when the bundle has none).
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
    topology: Topology
    p2p: pd.DataFrame
    allreduce: pd.DataFrame
    curves: Curves
    choices: NcclChoices
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
        return self.curves.backend

    @property
    def nccl_measured(self) -> bool:
        """True when the all-reduce rows come from NCCL (cuda), a model of it (sim) or an import
        of NCCL's output; gloo (cpu backend) reads no NCCL_* variable."""
        return self.ar_backend in ("cuda", "sim", "imported")

    @property
    def obtained(self) -> str:
        """How this bundle's numbers were obtained, as rule text says it (`simulated` or
        `measured`: pcieprof.analysis.provenance.obtained); never hard-code the word."""
        backend = self.ar_backend
        if backend in ("none", "mixed"):
            backend = str(self.bundle.backend or "")
        return obtained(backend)

    @property
    def confidence(self) -> str:
        """`simulated` for sim bundles, else `measured`."""
        return self.obtained

    def nccl_default(self) -> NcclCase | None:
        """What NCCL chose with no setting (nccl_choices.json), or None."""
        return self.choices.default_case()

    def chosen_protocols(self) -> dict[str, list[int]]:
        """Protocol NCCL's tuner picked per all-reduce size inside the decode band: {proto: sizes}."""
        case = self.nccl_default()
        return case.protocols(self.band.lo_bytes, self.band.hi_bytes) if case else {}

    def default_nchannels(self) -> int | None:
        """Channels NCCL used by default, or None when no log says."""
        case = self.nccl_default()
        return case.parsed.nchannels if case and case.parsed else None

    def gains(self, base: Curve, new: Curve) -> tuple[dict[int, float], dict[int, float], float]:
        """Per batch of the band: us saved per all-reduce, ms saved per step; and the mean
        relative gain. Sizes either curve does not cover (an extrapolation) are left out."""
        per_ar, per_step, rel = {}, {}, []
        for b in self.band.batches:
            size = self.band.message_bytes(b)
            if not (base.covers(size) and new.covers(size)):
                continue
            t0, t1 = base.at(size), new.at(size)
            per_ar[b] = t0 - t1
            per_step[b] = (t0 - t1) * self.collectives_per_step(b) / 1e3
            rel.append((t0 - t1) / t0 if t0 > 0 else 0.0)
        return per_ar, per_step, (sum(rel) / len(rel) if rel else 0.0)


def ranking(per_step: dict[int, float], rel: float, weight: float = 1.0) -> dict[str, Any]:
    """A gain rule's ordering key and how it was scored, as Recommendation keywords
    (`priority`, `ranked_by`): 10 x the mean ms saved per decode step over the band (when
    collectives are counted), else 100 x the relative gain; `weight` scales rules whose gain is
    partly off the decode path."""
    vals = [v for v in per_step.values() if math.isfinite(v)]
    scaled = f", x {weight:g} (its gain is mostly at large messages)" if weight != 1.0 else ""
    if vals and any(vals):
        mean = sum(vals) / len(vals)
        batches = sorted(b for b, v in per_step.items() if math.isfinite(v))
        priority = weight * 10.0 * mean
        return {"priority": priority,
                "ranked_by": f"score {priority:.1f} = 10 x mean decode-step gain over batch "
                             f"{batches[0]}-{batches[-1]}, {mean:.2f} ms{scaled}"}
    priority = weight * 100.0 * rel
    return {"priority": priority,
            "ranked_by": f"score {priority:.1f} = 100 x its relative gain at decode sizes, "
                         f"{rel * 100:.0f}%{scaled}"}


def fixed_rank(priority: float) -> str:
    """How a rule's fixed ordering key reads on its card: a correctness finding ranks above any
    gain, an unpriced card after every priced one (pcieprof.bundle.recommendations.ranked)."""
    where = ("a correctness finding: above any gain" if priority >= CORRECTNESS else
             "unpriced: after every priced card")
    return f"score {priority:g}, {FIXED} for this kind of finding ({where})"


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
        step_txt = f"{-per_step[b0]:+.2f} ms per decode step"
        if base is not None and band is not None and per_ar[b0]:
            # the step's all-reduce time here, then the saving as a share of the whole token
            comm = base.at(band.message_bytes(b0)) * per_step[b0] / per_ar[b0]  # us x n/1e3: ms
            share = token_share(band.model, b0, comm, per_step[b0])
            step_txt += f" ({share})" if share else ""
        parts.append(step_txt)
    b1 = max(per_ar)
    if b1 != b0:
        parts.append(f"{-per_ar[b1]:+.1f} us at batch {b1}" if abs(per_ar[b1]) >= 0.05
                     else f"no change at batch {b1}")
    return ", ".join(parts)
