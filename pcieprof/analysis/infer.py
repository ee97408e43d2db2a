"""Infer the real PCIe fabric from measurements: which GPUs share a switch, a root complex, a socket.

A VM often shows a flat virtual tree (every GPU on one root bus), but the copies still run through
the real switches, so the P2P matrices keep the real structure: pairs behind one switch are fast
and low-latency, pairs through the root complex slower, pairs across sockets slowest. We cluster
the pair values into levels (a new level starts where sorted values jump by more than
`LEVEL_JUMP`) and group GPUs level by level, finest first. All-reduce over GPU pairs (nranks=2)
serves as the matrix when P2P copies were not measured (e.g. an nccl-tests import).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from pcieprof.analysis.matrices import gpu_indices, pair_matrix
from pcieprof.bundle.topology import Topology

#: Relative jump between *adjacent* sorted pair values that starts a new level. Within one level
#: real measurements spread by a few percent overall, but neighbouring sorted values differ by far
#: less; between levels (switch vs root complex, ~9% in a VM with ACS redirect) they jump.
LEVEL_JUMP = 0.06

#: What the levels are called, finest first, by how many distinct levels there are.
_LEVEL_NAMES = {1: ["one level: every pair alike"],
                2: ["same switch", "through the root complex or across sockets"],
                3: ["same switch", "same root complex / socket", "across sockets"],
                4: ["same switch", "same root port group", "same socket", "across sockets"]}
#: The nvidia-smi topo -m level each inferred level corresponds to (finest first).
_SMI_LEVELS = {1: ["PIX"], 2: ["PXB", "SYS"], 3: ["PXB", "NODE", "SYS"],
               4: ["PIX", "PXB", "NODE", "SYS"]}


@dataclass
class Level:
    """One level of the inferred hierarchy.

    Attributes:
        name: e.g. "same switch".
        smi_level: nvidia-smi vocabulary (PIX, PXB, NODE, SYS).
        groups: GPU groups joined at this level (each sorted).
        value: typical pair value at this level (GB/s or us, see InferredTopology.metric).
    """

    name: str
    smi_level: str
    groups: list[list[int]]
    value: float


@dataclass
class InferredTopology:
    """The inferred hierarchy and the evidence it came from.

    Attributes:
        gpus: GPU indices.
        metric: what was clustered: `p2p bandwidth_gbps`, `p2p latency_us`, `allreduce pairs`.
        levels: finest first; the last level joins every GPU.
        pair_level: (a, b) -> index into levels of the finest level joining them.
        visible_levels: the pairwise levels the OS/VM shows (topology.json), for comparison.
        hidden_structure: True when the measured structure is finer than the visible tree
            (the VM hides its switches).
        evidence: human-readable lines.
    """

    gpus: list[int]
    metric: str
    levels: list[Level]
    pair_level: dict[tuple[int, int], int]
    visible_levels: dict[tuple[int, int], str] = field(default_factory=dict)
    hidden_structure: bool = False
    evidence: list[str] = field(default_factory=list)

    def switch_groups(self) -> list[list[int]]:
        """GPUs sharing the finest level (one switch each) when there is more than one level."""
        return self.levels[0].groups if len(self.levels) > 1 else [list(self.gpus)]

    def socket_groups(self) -> list[list[int]]:
        """GPUs on one side of the coarsest split (socket or root complex)."""
        return self.levels[-2].groups if len(self.levels) > 1 else [list(self.gpus)]

    def as_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "metric": self.metric,
                "levels": [{"name": l.name, "smi_level": l.smi_level, "groups": l.groups,
                            "value": l.value} for l in self.levels],
                "hidden_structure": self.hidden_structure, "evidence": self.evidence}


#: Smallest absolute step that can separate levels: differences below these do not change what
#: NCCL or a ring would do (GB/s for bandwidth, us for latency).
MIN_STEP = {True: 1.0, False: 0.1}


def split_levels(values: list[float], higher_is_better: bool, jump: float = LEVEL_JUMP) -> list[float]:
    """Cut points between levels of pair values, best level first (thresholds between levels)."""
    vals = sorted((v for v in values if np.isfinite(v) and v > 0), reverse=higher_is_better)
    cuts: list[float] = []
    for a, b in zip(vals, vals[1:]):
        ratio = a / b if higher_is_better else b / a
        if ratio > 1 + jump and abs(a - b) >= MIN_STEP[higher_is_better]:
            cuts.append((a + b) / 2)
    return cuts


def _groups(gpus: list[int], joined: dict[tuple[int, int], bool]) -> list[list[int]]:
    parent = {g: g for g in gpus}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for (a, b), ok in joined.items():
        if ok:
            parent[find(a)] = find(b)
    out: dict[int, list[int]] = {}
    for g in gpus:
        out.setdefault(find(g), []).append(g)
    return sorted((sorted(v) for v in out.values()), key=lambda x: x[0])


def infer_from_matrix(m: np.ndarray, gpus: list[int], *, higher_is_better: bool,
                      metric: str) -> InferredTopology:
    """Cluster a pair matrix into levels (symmetrised: the worse of both directions)."""
    n = len(gpus)
    sym = np.where(np.isnan(m), np.nan, m)
    sym = np.fmin(sym, sym.T) if higher_is_better else np.fmax(sym, sym.T)
    pairs = {(gpus[i], gpus[j]): float(sym[i, j]) for i in range(n) for j in range(i + 1, n)}
    cuts = split_levels(list(pairs.values()), higher_is_better)
    nlev = len(cuts) + 1
    names = _LEVEL_NAMES.get(nlev, [f"level {k}" for k in range(nlev)])
    smi = _SMI_LEVELS.get(nlev, ["PXB"] * (nlev - 1) + ["SYS"])
    levels: list[Level] = []
    pair_level: dict[tuple[int, int], int] = {}

    def level_of(v: float) -> int:
        if not np.isfinite(v):
            return nlev - 1
        k = 0
        for c in cuts:
            if (v < c) if higher_is_better else (v > c):
                k += 1
        return k

    for (a, b), v in pairs.items():
        pair_level[(a, b)] = pair_level[(b, a)] = level_of(v)
    for k in range(nlev):
        joined = {p: lv <= k for p, lv in pair_level.items() if p[0] < p[1]}
        vals = [v for p, v in pairs.items() if pair_level[p] == k and np.isfinite(v)]
        levels.append(Level(names[k], smi[k], _groups(gpus, joined),
                            float(np.median(vals)) if vals else float("nan")))
    # a level whose groups did not change is not a level of the hierarchy: merge them away
    return InferredTopology(gpus=gpus, metric=metric, levels=levels, pair_level=pair_level)


def allreduce_pair_matrix(ar: pd.DataFrame, gpus: list[int]) -> np.ndarray:
    """busbw (GB/s) of 2-rank all-reduces at their largest size, as a pair matrix."""
    pos = {g: i for i, g in enumerate(gpus)}
    m = np.full((len(gpus), len(gpus)), np.nan)
    rows = ar[(ar["nranks"] == 2) & (ar["status"] == "ok") & ar["busbw_gbps"].notna()]
    if "variant" in rows and (rows["variant"] == "default").any():
        rows = rows[rows["variant"] == "default"]
    for ranks, g in rows.groupby("ranks"):
        if len(ranks) != 2:
            continue
        a, b = ranks
        if a in pos and b in pos:
            top = g[g["size_bytes"] == g["size_bytes"].max()]["busbw_gbps"].median()
            m[pos[a], pos[b]] = m[pos[b], pos[a]] = float(top)
    return m


def infer(p2p: pd.DataFrame, allreduce: pd.DataFrame | None = None,
          topology: Topology | None = None) -> InferredTopology | None:
    """Infer the hierarchy from a bundle's tables (P2P bandwidth, else latency, else pairs' all-reduce).

    Args:
        p2p: the bundle's p2p table.
        allreduce: the bundle's allreduce table (2-rank sub-groups used as a fallback).
        topology: topology.json, to compare with what the OS/VM shows.

    Returns:
        The inference, or None when nothing pairwise was measured.
    """
    gpus = gpu_indices(p2p)
    result: InferredTopology | None = None
    if gpus:
        bw = pair_matrix(p2p, path="p2p", metric="bandwidth_gbps", gpus=gpus)
        lat = pair_matrix(p2p, path="p2p", metric="latency_us", gpus=gpus)
        cand = []
        if not np.isnan(bw).all():
            cand.append(infer_from_matrix(bw, gpus, higher_is_better=True,
                                          metric="p2p bandwidth_gbps"))
        if not np.isnan(lat).all():
            cand.append(infer_from_matrix(lat, gpus, higher_is_better=False,
                                          metric="p2p latency_us"))
        if cand:
            # the one that separates more levels carries more structure
            result = max(cand, key=lambda t: len(t.levels))
    if result is None and allreduce is not None and not allreduce.empty:
        pairs = allreduce[allreduce["nranks"] == 2]
        ids = sorted({int(x) for r in pairs["ranks"] for x in r})
        if len(ids) >= 2:
            m = allreduce_pair_matrix(allreduce, ids)
            if not np.isnan(m).all():
                result = infer_from_matrix(m, ids, higher_is_better=True,
                                           metric="allreduce pairs busbw_gbps")
    if result is None:
        return None
    _explain(result, topology or Topology())
    return result


def _explain(t: InferredTopology, topology: Topology) -> None:
    for lv in t.levels:
        groups = " | ".join(",".join(str(g) for g in grp) for grp in lv.groups)
        unit = "GB/s" if "gbps" in t.metric else "us"
        t.evidence.append(f"{lv.name} ({lv.smi_level}): groups {groups}; typical pair "
                          f"{lv.value:.3g} {unit} ({t.metric})")
    visible = topology.levels()
    t.visible_levels = visible
    virt = topology.virtualization
    if len(t.levels) > 1:
        vis_kinds = {v for (a, b), v in visible.items() if a in t.gpus and b in t.gpus}
        measured_classes = len(t.levels)
        finer = not visible or len(vis_kinds) < measured_classes
        if finer and (virt.flat_pcie_tree or virt.is_vm):
            t.hidden_structure = True
            t.evidence.append(
                f"the visible tree shows {len(vis_kinds) or 'no'} pair level(s) "
                f"({', '.join(sorted(vis_kinds)) or 'none'}) but the measurements show "
                f"{measured_classes}: the real switches are hidden (flat virtual tree)")
        elif finer and visible:
            t.evidence.append(
                f"the measurements separate {measured_classes} levels where nvidia-smi shows "
                f"{len(vis_kinds)} ({', '.join(sorted(vis_kinds))}); on bare metal that is "
                f"distance inside the host (root ports, IO dies), not a hidden switch")
