"""Infer the fabric from whatever a bundle holds: which GPUs share NVLink, a switch, a root
complex, a socket, and which pairs have no P2P at all.

Every GPU pair is first given a kind:
- `nvlink`: nvidia-smi says NV#, or a peer copy ran faster than any PCIe link can carry
  (`PCIE_MAX_GBPS`);
- `no_p2p`: the tool found no peer access (p2p rows `not_supported`): its copies, and NCCL's
  traffic, go through host memory. Such a pair is a level of its own, valued at its host-staged
  copy, never at 0 GB/s;
- `pcie`: peer copies over PCIe.

PCIe pairs are clustered into levels by their measured values: a new level starts where sorted
values jump by more than `LEVEL_JUMP`, by more than `MIN_STEP` and by more than `SPREAD_STEPS`
times the matrix's own spread (how much the two directions of one pair disagree). NVLink pairs
are split by link count where nvidia-smi gives it, else by value in the same way. Levels are
ordered fastest first: NVLink, PCIe, no P2P. A level's groups are the GPUs joined by pairs of its
kind at it or a faster level (the no-P2P level joins everything).

A VM often shows a flat virtual tree (every GPU on one root bus), but the copies still run through
the real switches, so the P2P matrices keep the real structure: pairs behind one switch are fast
and low-latency, pairs through the root complex slower, pairs across sockets slowest. Without P2P
rows, 2-rank all-reduces (nranks=2, e.g. an nccl-tests import) serve as the matrix; without
either, the levels topology.json shows (nvidia-smi topo -m, NVML) are the hierarchy, unmeasured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from pcieprof.analysis.matrices import direction_spread, gpu_indices, link_matrix, pair_support
from pcieprof.bundle.topology import Topology

#: Relative jump between *adjacent* sorted pair values that starts a new level. Within one level
#: real measurements spread by a few percent overall, but neighbouring sorted values differ by far
#: less; between levels (switch vs root complex, ~9% in a VM with ACS redirect) they jump.
LEVEL_JUMP = 0.06

#: Smallest absolute step that can separate levels: differences below these do not change what
#: NCCL or a ring would do (GB/s for bandwidth, us for latency).
MIN_STEP = {True: 1.0, False: 0.1}

#: A step between levels must also exceed this many times the median disagreement between the two
#: directions of one pair (both cross the same links, so that is measurement spread). On a real
#: 4x RTX 6000 Ada box (../shared/samples/tool-outputs-more) one pair's latencies differ by up to
#: 0.12 us while every pair lies within 1.21-1.44 us: no level there.
SPREAD_STEPS = 2.0

#: The fastest PCIe link, per direction: Gen6 x16 = 64 GT/s x 16 lanes x 242/256 (FLIT mode) / 8
#: = 121 GB/s before packet overhead (PCI-SIG, PCI Express 6.0 base specification). A peer copy
#: faster than that did not cross PCIe: it ran over NVLink.
PCIE_MAX_GBPS = 64.0 * 16 * 242 / 256 / 8

NVLINK, PCIE, NO_P2P = "nvlink", "pcie", "no_p2p"
#: The metric of an inference from topology.json's levels alone (nothing measured).
VISIBLE = "topology levels"
#: Where topology.json's pair levels came from (Pair.level_source), for people.
LEVEL_SOURCES = {"nvml": "NVML", "topo -m": "nvidia-smi topo -m",
                 "topo -mp": "nvidia-smi topo -mp, PCIe paths only: NVLink not shown",
                 "pcie_tree": "the PCIe tree (lspci, sysfs)"}
_KIND_ORDER = (NVLINK, PCIE, NO_P2P)

#: What PCIe levels are called, finest first, by how many distinct PCIe levels there are.
_LEVEL_NAMES = {1: ["every pair alike"],
                2: ["same switch", "through the root complex or across sockets"],
                3: ["same switch", "same root complex / socket", "across sockets"],
                4: ["same switch", "same root port group", "same socket", "across sockets"]}
#: The nvidia-smi topo -m level each inferred PCIe level corresponds to (finest first), when
#: nvidia-smi's own levels are not known or hide the real tree (a VM's flat tree).
_SMI_LEVELS = {1: ["PIX"], 2: ["PXB", "SYS"], 3: ["PXB", "NODE", "SYS"],
               4: ["PIX", "PXB", "NODE", "SYS"]}
#: nvidia-smi's PCIe levels, nearest first, and what its legend says each is.
SMI_PCIE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")
_SMI_MEANING = {"PIX": "same switch (at most one PCIe bridge)",
                "PXB": "several PCIe bridges, no host bridge",
                "PHB": "through a PCIe host bridge (the CPU)",
                "NODE": "across host bridges of one NUMA node",
                "SYS": "across NUMA nodes (the SMP interconnect)"}
_NV = re.compile(r"NV(\d+)$")


@dataclass
class Level:
    """One level of the inferred hierarchy.

    Attributes:
        name: e.g. "same switch", "NVLink (4 links)", "no P2P: through host memory".
        smi_level: nvidia-smi vocabulary (NV#, PIX, PXB, PHB, NODE, SYS).
        groups: GPU groups joined at this level (each sorted).
        value: typical pair value at this level (GB/s or us, see InferredTopology.metric); for
            `no_p2p` the copy through host memory; None when nothing was measured.
        kind: `nvlink`, `pcie` or `no_p2p`.
        pairs: the GPU pairs (a < b) at this level.
    """

    name: str
    smi_level: str
    groups: list[list[int]]
    value: float | None
    kind: str = PCIE
    pairs: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class InferredTopology:
    """The inferred hierarchy and the evidence it came from.

    Attributes:
        gpus: GPU indices.
        metric: what was clustered: `p2p bandwidth_gbps`, `p2p latency_us`, `allreduce pairs
            busbw_gbps`, or `topology levels` (nothing measured: topology.json's levels).
        levels: finest first; the last level joins every GPU.
        pair_level: (a, b) -> index into levels of the level of the pair (both orders).
        visible_levels: the pairwise levels the OS/VM shows (topology.json), for comparison.
        hidden_structure: True when the measured PCIe structure is finer than the visible tree
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

    @property
    def measured(self) -> bool:
        """False when the levels are topology.json's alone (no copy or all-reduce measured)."""
        return self.metric != VISIBLE

    @property
    def unit(self) -> str:
        """Unit of the level values: `GB/s`, `us`, or "" when nothing was measured."""
        return "GB/s" if "gbps" in self.metric else "us" if "_us" in self.metric else ""

    def pcie_levels(self) -> list[Level]:
        """The PCIe levels, finest first (what a switch or socket split is read from)."""
        return [lv for lv in self.levels if lv.kind == PCIE]

    def kind_of(self, a: int, b: int) -> str | None:
        """`nvlink`, `pcie` or `no_p2p` for a pair, None when it was not seen."""
        k = self.pair_level.get((a, b))
        return None if k is None else self.levels[k].kind

    def pairs_of(self, kind: str) -> list[tuple[int, int]]:
        """Every pair (a < b) of one kind."""
        return sorted(p for lv in self.levels if lv.kind == kind for p in lv.pairs)

    def is_tree(self, k: int) -> bool:
        """True when level k's groups are joined pair by pair at it or faster (a hierarchy: a
        switch, a socket), False when its pairs cross-link groups (e.g. a bipartite pattern)."""
        lv = self.levels[k]
        upto = {p for other in self.levels[:k + 1]
                if other.kind == lv.kind or lv.kind == NO_P2P for p in other.pairs}
        return all(_is_clique(g, upto) for g in lv.groups if len(g) > 1)

    def where(self, k: int, limit: int = 12) -> str:
        """Level k for people: `groups 0,1 | 2,3` for a hierarchy level (PCIe: the GPUs joined at
        it or finer), an NVLink level's own groups when its pairs form whole groups, else
        `pairs 0-2, ...` (always pairs for the no-P2P level)."""
        lv = self.levels[k]
        if lv.kind == NVLINK:
            # NVLink levels are link counts, not a hierarchy: the GPUs joined at this count
            # alone (NV17 among NV18 is the odd pair, not "every GPU")
            own = [g for g in _groups(self.gpus, lv.pairs) if len(g) > 1]
            if own and all(_is_clique(g, set(lv.pairs)) for g in own):
                return "groups " + " | ".join(",".join(map(str, g)) for g in own)
        elif lv.kind != NO_P2P and any(len(g) > 1 for g in lv.groups) and self.is_tree(k):
            return "groups " + " | ".join(",".join(map(str, g)) for g in lv.groups)
        shown = ", ".join(f"{a}-{b}" for a, b in lv.pairs[:limit])
        return "pairs " + shown + (f" and {len(lv.pairs) - limit} more"
                                   if len(lv.pairs) > limit else "")

    def switch_groups(self) -> list[list[int]]:
        """GPUs sharing the finest PCIe level (one switch each) when there is more than one."""
        pcie = self.pcie_levels()
        return pcie[0].groups if len(pcie) > 1 else [list(self.gpus)]

    def socket_groups(self) -> list[list[int]]:
        """GPUs on one side of the coarsest PCIe split (socket or root complex)."""
        pcie = self.pcie_levels()
        return pcie[-2].groups if len(pcie) > 1 else [list(self.gpus)]

    def as_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "metric": self.metric,
                "levels": [{"name": lv.name, "smi_level": lv.smi_level, "groups": lv.groups,
                            "value": lv.value, "kind": lv.kind,
                            "pairs": [list(p) for p in lv.pairs]} for lv in self.levels],
                "hidden_structure": self.hidden_structure, "evidence": self.evidence}


def split_levels(values: list[float], higher_is_better: bool, jump: float = LEVEL_JUMP,
                 min_step: float | None = None) -> list[float]:
    """Cut points between levels of pair values, best level first (thresholds between levels).

    Args:
        values: one value per pair (non-finite and non-positive ones are ignored).
        higher_is_better: True for bandwidth, False for latency.
        jump: relative step between neighbouring sorted values that starts a level.
        min_step: smallest absolute step (default `MIN_STEP`).
    """
    step = MIN_STEP[higher_is_better] if min_step is None else min_step
    vals = sorted((v for v in values if np.isfinite(v) and v > 0), reverse=higher_is_better)
    cuts: list[float] = []
    for a, b in zip(vals, vals[1:]):
        ratio = a / b if higher_is_better else b / a
        if ratio > 1 + jump and abs(a - b) >= step:
            cuts.append((a + b) / 2)
    return cuts


def _level_of(v: float, cuts: list[float], higher_is_better: bool) -> int:
    return sum(1 for c in cuts if ((v < c) if higher_is_better else (v > c)))


def _groups(gpus: list[int], joined: list[tuple[int, int]]) -> list[list[int]]:
    parent = {g: g for g in gpus}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in joined:
        parent[find(a)] = find(b)
    out: dict[int, list[int]] = {}
    for g in gpus:
        out.setdefault(find(g), []).append(g)
    return sorted((sorted(v) for v in out.values()), key=lambda x: x[0])


def _symmetric(m: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """The worse of both directions of each pair (a ring link runs both ways)."""
    return np.fmin(m, m.T) if higher_is_better else np.fmax(m, m.T)


def _min_step(m: np.ndarray, higher_is_better: bool) -> float:
    spread, _ = direction_spread(m)
    return max(MIN_STEP[higher_is_better], SPREAD_STEPS * spread if np.isfinite(spread) else 0.0)


@dataclass
class _Bucket:
    """Pairs that will form one level, before groups are known."""

    kind: str
    pairs: list[tuple[int, int]]
    name: str
    smi_level: str


def _assemble(gpus: list[int], metric: str, buckets: list[_Bucket],
              value_of: dict[tuple[int, int], float] | None) -> InferredTopology:
    levels: list[Level] = []
    pair_level: dict[tuple[int, int], int] = {}
    for k, bk in enumerate(buckets):
        for a, b in bk.pairs:
            pair_level[(a, b)] = pair_level[(b, a)] = k
    for k, bk in enumerate(buckets):
        joined = [p for j, other in enumerate(buckets) if j <= k
                  and (other.kind == bk.kind or bk.kind == NO_P2P) for p in other.pairs]
        vals = [value_of[p] for p in bk.pairs if value_of is not None and p in value_of
                and np.isfinite(value_of[p])]
        levels.append(Level(bk.name, bk.smi_level, _groups(gpus, joined),
                            float(np.median(vals)) if vals else None, bk.kind, sorted(bk.pairs)))
    return InferredTopology(gpus=gpus, metric=metric, levels=levels, pair_level=pair_level)


def _pcie_buckets(pairs: dict[tuple[int, int], float], cuts: list[float],
                  higher_is_better: bool, alone: bool) -> list[_Bucket]:
    n = len(cuts) + 1
    names = _LEVEL_NAMES.get(n, [f"PCIe level {k}" for k in range(n)])
    if n == 1 and not alone:
        names = ["PCIe P2P, every such pair alike"]
    elif n == 1 and len(pairs) == 1:
        names = ["the one GPU pair"]
    smi = _SMI_LEVELS.get(n, ["PXB"] * (n - 1) + ["SYS"])
    out = [_Bucket(PCIE, [], names[k], smi[k]) for k in range(n)]
    for p, v in pairs.items():
        out[_level_of(v, cuts, higher_is_better)].pairs.append(p)
    return [b for b in out if b.pairs]


def infer_from_matrix(m: np.ndarray, gpus: list[int], *, higher_is_better: bool,
                      metric: str) -> InferredTopology:
    """Cluster one pair matrix into PCIe levels (symmetrised: the worse of both directions)."""
    sym = _symmetric(m, higher_is_better)
    n = len(gpus)
    pairs = {(gpus[i], gpus[j]): float(sym[i, j]) for i in range(n) for j in range(i + 1, n)
             if np.isfinite(sym[i, j])}
    cuts = split_levels(list(pairs.values()), higher_is_better,
                        min_step=_min_step(m, higher_is_better))
    return _assemble(gpus, metric, _pcie_buckets(pairs, cuts, higher_is_better, alone=True), pairs)


def _nv_count(level: str | None) -> int | None:
    m = _NV.match(level or "")
    return int(m.group(1)) if m else None


def _from_p2p(p2p: pd.DataFrame, gpus: list[int], topology: Topology) -> InferredTopology | None:
    """Kinds from p2p.csv's statuses and speeds, PCIe levels by bandwidth or latency."""
    support = pair_support(p2p, gpus)
    visible = topology.levels()
    mats = {True: link_matrix(p2p, metric="bandwidth_gbps", gpus=gpus)[0],
            False: link_matrix(p2p, metric="latency_us", gpus=gpus)[0]}
    if all(np.isnan(m).all() for m in mats.values()) and "not_supported" not in support.values():
        return None
    sym = {hib: _symmetric(m, hib) for hib, m in mats.items()}
    pos = {g: i for i, g in enumerate(gpus)}
    kind: dict[tuple[int, int], str] = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            x, y = pos[a], pos[b]
            measured = np.isfinite(sym[True][x, y]) or np.isfinite(sym[False][x, y])
            if "not_supported" in (support.get((a, b)), support.get((b, a))):
                kind[(a, b)] = NO_P2P  # a fact even where no copy through host memory ran
            elif _nv_count(visible.get((a, b))) is not None or (
                    np.isfinite(sym[True][x, y]) and sym[True][x, y] > PCIE_MAX_GBPS):
                kind[(a, b)] = NVLINK
            elif measured:
                kind[(a, b)] = PCIE

    def values(hib: bool, k: str) -> dict[tuple[int, int], float]:
        return {p: float(sym[hib][pos[p[0]], pos[p[1]]]) for p, kd in kind.items()
                if kd == k and np.isfinite(sym[hib][pos[p[0]], pos[p[1]]])}

    # the metric that separates more PCIe levels carries more structure (bandwidth on a tie)
    cuts = {hib: split_levels(list(values(hib, PCIE).values()), hib,
                              min_step=_min_step(mats[hib], hib)) for hib in (True, False)}
    usable = ([h for h in (True, False) if values(h, PCIE)]
              or [h for h in (True, False) if not np.isnan(mats[h]).all()] or [True])
    hib = max(usable, key=lambda h: (len(cuts[h]), h))
    metric = "p2p bandwidth_gbps" if hib else "p2p latency_us"
    value_of = {p: float(sym[hib][pos[p[0]], pos[p[1]]]) for p in kind}
    nvlink = {p: value_of[p] for p, k in kind.items() if k == NVLINK}  # NaN: not in this metric
    buckets = _nvlink_buckets(nvlink, visible, hib, mats[hib])
    pcie = values(hib, PCIE)
    alone = not any(k != PCIE for k in kind.values())
    buckets += _pcie_buckets(pcie, cuts[hib], hib, alone)
    unmeasured_pcie = [p for p, k in kind.items() if k == PCIE and p not in pcie]
    if unmeasured_pcie and buckets and buckets[-1].kind == PCIE:
        buckets[-1].pairs += unmeasured_pcie
    no_p2p = sorted(p for p, k in kind.items() if k == NO_P2P)
    if no_p2p:
        smi = _worst_visible(no_p2p, visible) or "SYS"
        buckets.append(_Bucket(NO_P2P, no_p2p, "no P2P: through host memory", smi))
    if not buckets:
        return None
    return _assemble(gpus, metric, buckets, value_of)


def _nvlink_buckets(pairs: dict[tuple[int, int], float], visible: dict[tuple[int, int], str],
                    hib: bool, m: np.ndarray) -> list[_Bucket]:
    """NVLink levels: by nvidia-smi's link count when it gives one for every pair, else by value."""
    if not pairs:
        return []
    counts = {p: _nv_count(visible.get(p)) for p in pairs}
    if all(c is not None for c in counts.values()):
        out = []
        for c in sorted({c for c in counts.values() if c is not None}, reverse=True):
            out.append(_Bucket(NVLINK, [p for p, x in counts.items() if x == c],
                               f"NVLink ({c} links)", f"NV{c}"))
        return out
    cuts = split_levels(list(pairs.values()), hib, min_step=_min_step(m, hib))
    out = [_Bucket(NVLINK, [], "NVLink" if not cuts else f"NVLink level {k + 1} of {len(cuts) + 1}",
                   "NV#") for k in range(len(cuts) + 1)]
    for p, v in pairs.items():
        out[_level_of(v, cuts, hib) if np.isfinite(v) else 0].pairs.append(p)
    return [b for b in out if b.pairs]


def _smi_rank(level: str) -> int:
    return SMI_PCIE_ORDER.index(level) if level in SMI_PCIE_ORDER else len(SMI_PCIE_ORDER)


def _worst_visible(pairs: list[tuple[int, int]], visible: dict[tuple[int, int], str]) -> str | None:
    """The farthest nvidia-smi PCIe level among the pairs, when it is known for every one."""
    seen = [visible.get(p) for p in pairs]
    if not seen or any(s is None or _nv_count(s) is not None for s in seen):
        return None
    return max((str(s) for s in seen), key=_smi_rank)


def _from_topology(topology: Topology) -> InferredTopology | None:
    """The levels nvidia-smi / NVML show (topology.json), with pairs NVML reports without P2P
    apart; nothing measured, so no values."""
    visible = topology.levels()
    state = {(min(p.a, p.b), max(p.a, p.b)): p.p2p_state() for p in topology.pairs}
    pairs = sorted({(min(a, b), max(a, b)) for (a, b) in visible if a != b})
    if not pairs:
        return None
    gpus = sorted({g for p in pairs for g in p})
    no_p2p = [p for p in pairs if state.get(p) == "not_supported"]
    rest = [p for p in pairs if p not in no_p2p]

    def order(level: str) -> tuple[int, int]:
        nv = _nv_count(level)
        return (0, -nv) if nv is not None else (1, _smi_rank(level))

    buckets = []
    for lv in sorted({visible[p] for p in rest}, key=order):
        nv = _nv_count(lv)
        name = (f"NVLink ({nv} links)" if nv is not None
                else _SMI_MEANING.get(lv, "as nvidia-smi names it"))
        buckets.append(_Bucket(NVLINK if nv is not None else PCIE,
                               [p for p in rest if visible[p] == lv], name, lv))
    if no_p2p:
        buckets.append(_Bucket(NO_P2P, no_p2p, "no P2P (nvidia-smi / NVML: not supported)",
                               _worst_visible(no_p2p, visible) or "SYS"))
    return _assemble(gpus, VISIBLE, buckets, None)


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
    """Infer the hierarchy from a bundle's tables: P2P (bandwidth or latency, with the pairs that
    have no P2P or run over NVLink apart), else 2-rank all-reduces, else topology.json's levels.

    Args:
        p2p: the bundle's p2p table.
        allreduce: the bundle's allreduce table (2-rank sub-groups used as a fallback).
        topology: topology.json, to compare with what the OS/VM shows.

    Returns:
        The inference, or None when nothing pairwise is known.
    """
    topology = topology or Topology()
    gpus = gpu_indices(p2p)
    result = _from_p2p(p2p, gpus, topology) if gpus else None
    if result is None and allreduce is not None and not allreduce.empty:
        pairs = allreduce[allreduce["nranks"] == 2]
        ids = sorted({int(x) for r in pairs["ranks"] for x in r})
        if len(ids) >= 2:
            m = allreduce_pair_matrix(allreduce, ids)
            if not np.isnan(m).all():
                result = infer_from_matrix(m, ids, higher_is_better=True,
                                           metric="allreduce pairs busbw_gbps")
    if result is None:
        result = _from_topology(topology)
    if result is None:
        return None
    _explain(result, topology)
    return result


def _is_clique(group: list[int], pairs: set[tuple[int, int]]) -> bool:
    return all((a, b) in pairs for i, a in enumerate(group) for b in group[i + 1:])




def value_text(value: float | None, unit: str) -> str:
    """A level's typical value for people: `26.3 GB/s`, `1.24 us`, or `not measured`."""
    if value is None or not np.isfinite(value):
        return "not measured"
    return f"{value:.3g} {unit}" if unit else f"{value:.3g}"


def _explain(t: InferredTopology, topology: Topology) -> None:
    visible = topology.levels()
    t.visible_levels = visible
    virt = topology.virtualization
    flat = bool(virt.flat_pcie_tree)
    pcie = t.pcie_levels()
    vis_kinds = {v for (a, b), v in visible.items() if a in t.gpus and b in t.gpus
                 and _nv_count(v) is None}
    hidden = len(pcie) > 1 and len(vis_kinds) < len(pcie) and (flat or bool(virt.is_vm))
    if t.metric != VISIBLE and not hidden:
        # on bare metal nvidia-smi's own word for a measured level is the truer one
        for lv in pcie:
            lv.smi_level = _worst_visible(lv.pairs, visible) or lv.smi_level
    measured = t.measured
    ks = [k for k, lv in enumerate(t.levels) if lv.kind == PCIE]
    if measured and len(ks) > 1 and not all(t.is_tree(k) for k in ks):
        # pairs that cross-link groups are no switch or socket: name the levels by speed only
        for n, k in enumerate(ks, 1):
            t.levels[k].name = f"PCIe level {n} of {len(ks)} ({'fastest' if n == 1 else 'slowest' if n == len(ks) else 'between'})"
    for k, lv in enumerate(t.levels):
        # say nvidia-smi's word only where it is known, not where the level count suggests it
        known = not measured or lv.smi_level.startswith("NV") or (
            not hidden and _worst_visible(lv.pairs, visible) is not None)
        line = f"{lv.name}{f' ({lv.smi_level})' if known else ''}: {t.where(k)}"
        if measured:
            line += f"; typical pair {value_text(lv.value, t.unit)} ({t.metric})"
        if lv.kind == NO_P2P and measured:
            line += ("; the tool found no peer access for these pairs: their copies (and NCCL's "
                     "traffic, through its SHM transport) go through host memory")
        elif lv.kind == NVLINK and measured and lv.smi_level == "NV#":
            line += (f"; faster than any PCIe link carries ({PCIE_MAX_GBPS:.0f} GB/s one way, "
                     "Gen6 x16): NVLink (nvidia-smi topo -m gives the link count)")
        t.evidence.append(line)
    if not measured:
        sources = sorted({LEVEL_SOURCES.get(str(p.level_source), "nvidia-smi topo -m")
                          for p in topology.pairs if p.level is not None})
        t.evidence.append(f"levels as topology.json gives them (from {', '.join(sources)}); "
                          "no copy between the GPUs was measured")
    if flat:
        t.evidence += [f"flat virtual PCIe tree (topology.json): {e}" for e in virt.evidence]
    if hidden:
        t.hidden_structure = True
        t.evidence.append(
            f"the visible tree shows {len(vis_kinds) or 'no'} PCIe pair level(s) "
            f"({', '.join(sorted(vis_kinds)) or 'none'}) but the measurements show "
            f"{len(pcie)}: the real switches are hidden (flat virtual tree)")
    elif measured and vis_kinds and len(pcie) > len(vis_kinds):
        t.evidence.append(
            f"the measurements separate {len(pcie)} PCIe levels where nvidia-smi shows "
            f"{len(vis_kinds)} ({', '.join(sorted(vis_kinds))}); on bare metal that is "
            f"distance inside the host (root ports, IO dies), not a hidden switch")
    elif measured and len(pcie) == 1 and len(vis_kinds) > 1 and len(pcie[0].pairs) > 1:
        t.evidence.append(
            f"nvidia-smi shows {len(vis_kinds)} PCIe levels ({', '.join(sorted(vis_kinds, key=_smi_rank))}) "
            f"but the measured pairs do not differ beyond their spread: on this box those paths "
            f"are equally fast")
