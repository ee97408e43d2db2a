"""What the P2P rows say is wrong with a box: directions that differ by more than the measurement
spread, peer copies slower than the same copy through host memory, pairs the copy tool found
without peer access while nvidia-smi says there is a path. The tuner's finding rules
(pcieprof.tune.rules.p2p_asymmetry, p2p_below_staged, p2p_support_mismatch) word them.

The spread: a pair's two directions cross the same links, and so do host-staged copies in both
directions, so where a tool gives one number per copy the disagreement between directions over
the matrix (its median, robust to the one broken pair) is the spread; where the rows carry the
min and max of repeated trials, those count too. A difference is a finding only beyond
`SPREAD_FACTOR` times that spread and never below `MIN_DIFFERENCE`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pcieprof.analysis.matrices import direction_spread, gpu_indices, pair_matrix, pair_support
from pcieprof.bundle.topology import Topology

#: Smallest relative difference ever reported: p2pBandwidthLatencyTest prints one number per copy
#: and its notes say results vary; within one level of the shared real matrices the pairs differ
#: by at most 4.4% (3.42 vs 3.57 GB/s on the 5-GPU Gen3 x4 box, two GPU models).
MIN_DIFFERENCE = 0.10

#: A difference must exceed this many times the measured spread (relative) to count.
SPREAD_FACTOR = 3.0


@dataclass
class Spread:
    """Relative measurement spread of a bundle's P2P bandwidth and where the figure came from."""

    relative: float
    source: str

    @property
    def threshold(self) -> float:
        """The relative difference beyond which two copies differ."""
        return max(MIN_DIFFERENCE, SPREAD_FACTOR * self.relative)

    def text(self) -> str:
        return (f"differences count beyond {self.threshold * 100:.0f}% (spread "
                f"{self.relative * 100:.1f}%, {self.source})")


def bandwidth_spread(p2p: pd.DataFrame, gpus: list[int]) -> Spread:
    """The relative spread of one bandwidth figure, from what the rows hold (see module doc)."""
    parts: list[tuple[float, str]] = []
    staged = pair_matrix(p2p, path="host_staged", metric="bandwidth_gbps", gpus=gpus)
    _, rel = direction_spread(staged)
    if np.isfinite(rel):
        parts.append((rel, "host-staged copies, one direction against the other"))
    peer = pair_matrix(p2p, path="p2p", metric="bandwidth_gbps", gpus=gpus)
    both = sum(1 for i in range(len(gpus)) for j in range(i + 1, len(gpus))
               if np.isfinite(peer[i, j]) and np.isfinite(peer[j, i]))
    if both >= 3:  # a median over enough pairs that one broken pair does not set it
        _, rel = direction_spread(peer)
        parts.append((rel, f"P2P copies over {both} pairs, one direction against the other"))
    rows = p2p[(p2p["path"] == "p2p") & (p2p["status"] == "ok") & p2p["bandwidth_gbps"].notna()]
    if {"bandwidth_gbps_min", "bandwidth_gbps_max"} <= set(rows.columns):
        ranged = rows[rows["bandwidth_gbps_min"].notna() & rows["bandwidth_gbps_max"].notna()
                      & (rows["bandwidth_gbps"] > 0)]
        if not ranged.empty:
            rel = float(((ranged["bandwidth_gbps_max"] - ranged["bandwidth_gbps_min"])
                         / ranged["bandwidth_gbps"]).median())
            parts.append((rel, "min..max of repeated trials"))
    if not parts:
        return Spread(0.0, "not measurable from these rows")
    rel, source = max(parts)
    return Spread(rel, source)


def _trial_range(p2p: pd.DataFrame, src: int, dst: int) -> tuple[float, float] | None:
    """(min, max) of the trials of a pair's largest p2p copy, when the rows carry them."""
    rows = p2p[(p2p["path"] == "p2p") & (p2p["status"] == "ok") & (p2p["src"] == src)
               & (p2p["dst"] == dst) & (p2p["direction"] == "uni") & p2p["bandwidth_gbps"].notna()]
    if rows.empty or not {"bandwidth_gbps_min", "bandwidth_gbps_max"} <= set(rows.columns):
        return None
    top = rows[rows["size_bytes"] == rows["size_bytes"].max()]
    lo, hi = top["bandwidth_gbps_min"].min(), top["bandwidth_gbps_max"].max()
    return (float(lo), float(hi)) if pd.notna(lo) and pd.notna(hi) else None


@dataclass
class Asymmetry:
    """A pair whose two P2P directions differ beyond the spread (GB/s, largest copies)."""

    fast: tuple[int, int]
    slow: tuple[int, int]
    fast_gbps: float
    slow_gbps: float

    @property
    def ratio(self) -> float:
        return self.fast_gbps / self.slow_gbps


def asymmetric_pairs(p2p: pd.DataFrame, spread: Spread | None = None) -> list[Asymmetry]:
    """Pairs whose P2P bandwidth one way differs from the other way beyond the spread (and, where
    trials were repeated, whose trial ranges do not overlap); largest ratio first."""
    gpus = gpu_indices(p2p)
    spread = spread or bandwidth_spread(p2p, gpus)
    m = pair_matrix(p2p, path="p2p", metric="bandwidth_gbps", gpus=gpus)
    out = []
    for i, a in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            b = gpus[j]
            x, y = float(m[i, j]), float(m[j, i])
            if not (np.isfinite(x) and np.isfinite(y) and min(x, y) > 0):
                continue
            fast, slow = ((a, b), (b, a)) if x >= y else ((b, a), (a, b))
            hi, lo = max(x, y), min(x, y)
            if hi / lo - 1 <= spread.threshold:
                continue
            r_hi, r_lo = _trial_range(p2p, *fast), _trial_range(p2p, *slow)
            if r_hi and r_lo and r_lo[1] >= r_hi[0]:
                continue  # the trials overlap: not a difference the data can show
            out.append(Asymmetry(fast, slow, hi, lo))
    return sorted(out, key=lambda s: -s.ratio)


@dataclass
class BelowStaged:
    """An ordered pair whose P2P copy is slower than its copy through host memory (GB/s)."""

    src: int
    dst: int
    p2p_gbps: float
    staged_gbps: float


def slower_than_staged(p2p: pd.DataFrame, spread: Spread | None = None) -> list[BelowStaged]:
    """Ordered pairs whose P2P bandwidth is below the host-staged copy of the same pair by more
    than the spread; slowest relative to staging first."""
    gpus = gpu_indices(p2p)
    spread = spread or bandwidth_spread(p2p, gpus)
    peer = pair_matrix(p2p, path="p2p", metric="bandwidth_gbps", gpus=gpus)
    staged = pair_matrix(p2p, path="host_staged", metric="bandwidth_gbps", gpus=gpus)
    out = []
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            x, s = float(peer[i, j]), float(staged[i, j])
            if i != j and np.isfinite(x) and np.isfinite(s) and x > 0 \
                    and s / x - 1 > spread.threshold:
                out.append(BelowStaged(a, b, x, s))
    return sorted(out, key=lambda r: r.p2p_gbps / r.staged_gbps)


@dataclass
class SupportMismatch:
    """A pair the copy tool found without peer access while nvidia-smi / NVML show a path."""

    src: int
    dst: int
    tool_says: str
    topology_says: str


def support_mismatches(p2p: pd.DataFrame, topology: Topology) -> list[SupportMismatch]:
    """Ordered pairs whose p2p rows are `not_supported` although topology.json says P2P is OK
    there (`nvidia-smi topo -p2p`, NVML) or joins them by NVLink (`topo -m` NV#)."""
    support = pair_support(p2p)
    levels = topology.levels()
    state = {(p.a, p.b): p for p in topology.pairs}
    out = []
    for (a, b), s in sorted(support.items()):
        if s != "not_supported":
            continue
        pair = state.get((a, b)) or state.get((b, a))
        says = []
        if pair is not None and pair.p2p_state() == "ok":
            caps = ", ".join(f"{k} {pair.p2p[k]}" for k in ("read", "write", "pcie")
                             if pair.p2p.get(k))
            says.append(f"nvidia-smi topo -p2p / NVML: {caps}")
        if str(levels.get((a, b), "")).startswith("NV"):
            says.append(f"nvidia-smi topo -m: {levels[(a, b)]} (NVLink)")
        if not says:
            continue
        rows = p2p[(p2p["path"] == "p2p") & (p2p["src"] == a) & (p2p["dst"] == b)
                   & (p2p["status"] == "not_supported")]
        detail = str(rows["detail"].iloc[0]) if not rows.empty else "status not_supported"
        out.append(SupportMismatch(a, b, detail, "; ".join(says)))
    return out
