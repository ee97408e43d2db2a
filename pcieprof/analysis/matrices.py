"""GPU x GPU matrices from a bundle's p2p.csv: the common input of the tuner and the report."""

from __future__ import annotations

import numpy as np
import pandas as pd


def gpu_indices(p2p: pd.DataFrame) -> list[int]:
    """GPU indices that appear as src or dst of a pairwise (p2p / host_staged) row."""
    pair = p2p[p2p["path"].isin(["p2p", "host_staged"])]
    ids = set(int(x) for x in pair["src"]) | set(int(x) for x in pair["dst"])
    return sorted(i for i in ids if i >= 0)


def pair_matrix(p2p: pd.DataFrame, *, path: str, metric: str, direction: str = "uni",
                gpus: list[int] | None = None) -> np.ndarray:
    """An n x n matrix of one metric for one path; NaN where not measured or not `status=ok`.

    Bandwidth uses each pair's largest measured size (the asymptote); latency its smallest size.
    Where a pair has several rows at that size, the median is taken.

    Args:
        p2p: the bundle's p2p table.
        path: `p2p` or `host_staged`.
        metric: `bandwidth_gbps` (GB/s) or `latency_us` (microseconds).
        direction: `uni` or `bi`.
        gpus: GPU indices for rows/columns (default: all that appear).
    """
    gpus = gpu_indices(p2p) if gpus is None else gpus
    pos = {g: i for i, g in enumerate(gpus)}
    m = np.full((len(gpus), len(gpus)), np.nan)
    rows = p2p[(p2p["path"] == path) & (p2p["status"] == "ok") & p2p[metric].notna()]
    if "direction" in rows and metric == "bandwidth_gbps":
        rows = rows[rows["direction"] == direction]
    # One pass over all pairs (a loop of pandas calls per pair took seconds per report)
    keys = ["src", "dst"]
    edge = rows.groupby(keys)["size_bytes"].transform(
        "max" if metric == "bandwidth_gbps" else "min")
    at_edge = rows[rows["size_bytes"] == edge]
    for (src, dst), value in at_edge.groupby(keys)[metric].median().items():
        if int(src) in pos and int(dst) in pos:
            m[pos[int(src)], pos[int(dst)]] = float(value)
    return m


def pair_status(p2p: pd.DataFrame, *, path: str, gpus: list[int]) -> dict[tuple[int, int], str]:
    """Non-ok statuses per (src, dst) for one path (e.g. `error` for wrong bytes, `hang`)."""
    bad = p2p[(p2p["path"] == path) & (p2p["status"] != "ok")]
    out: dict[tuple[int, int], str] = {}
    for _, r in bad.iterrows():
        out[(int(r["src"]), int(r["dst"]))] = str(r["status"])
    return {k: v for k, v in out.items() if k[0] in gpus and k[1] in gpus}


#: p2p row statuses from worst to best: a pair's support is the worst status among its rows
#: (a copy that returned wrong bytes outweighs one that completed; `waived` and the like are
#: no evidence either way).
SUPPORT_ORDER = ("error", "hang", "failed", "not_supported", "ok")


def pair_support(p2p: pd.DataFrame, gpus: list[int] | None = None) -> dict[tuple[int, int], str]:
    """What the p2p rows (path `p2p`) say of each ordered pair: `ok` (peer copies completed),
    `not_supported` (the tool found no peer access; its copies went through host memory),
    `error` (wrong bytes), `hang` or `failed`. Pairs without such rows are left out."""
    rows = p2p[(p2p["path"] == "p2p") & p2p["status"].isin(SUPPORT_ORDER)]
    out: dict[tuple[int, int], str] = {}
    for (src, dst), grp in rows.groupby(["src", "dst"]):
        key = (int(src), int(dst))
        if gpus is not None and (key[0] not in gpus or key[1] not in gpus):
            continue
        out[key] = min((str(s) for s in grp["status"]), key=SUPPORT_ORDER.index)
    return out


def link_matrix(p2p: pd.DataFrame, *, metric: str, gpus: list[int]
                ) -> tuple[np.ndarray, set[tuple[int, int]]]:
    """What a transfer between each ordered pair runs at: P2P where peer copies work, else host
    memory, which is where NCCL sends the traffic of a pair without peer access (its SHM
    transport).

    For a pair whose p2p rows are `not_supported` the value is the pair's host-staged copy, or,
    without one, the tool's own fallback copy (the value of the `not_supported` row: the sample
    copied through host memory). Unmeasured pairs stay NaN; no pair is ever 0.

    Args:
        p2p: the bundle's p2p table.
        metric: `bandwidth_gbps` (GB/s, the largest size) or `latency_us` (us, the smallest).
        gpus: GPU indices for rows and columns.

    Returns:
        (matrix, the ordered pairs whose value is a copy through host memory).
    """
    m = pair_matrix(p2p, path="p2p", metric=metric, gpus=gpus)
    staged = pair_matrix(p2p, path="host_staged", metric=metric, gpus=gpus)
    support = pair_support(p2p, gpus)
    fallback = p2p[(p2p["path"] == "p2p") & (p2p["status"] == "not_supported")]
    fb = pair_matrix(fallback.assign(status="ok"), path="p2p", metric=metric, gpus=gpus)
    via_host: set[tuple[int, int]] = set()
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if i == j or support.get((a, b)) != "not_supported" or np.isfinite(m[i, j]):
                continue
            value = staged[i, j] if np.isfinite(staged[i, j]) else fb[i, j]
            if np.isfinite(value) and value > 0:
                m[i, j] = value
                via_host.add((a, b))
    return m, via_host


def direction_spread(m: np.ndarray) -> tuple[float, float]:
    """How much the two directions of one pair disagree, over the pairs measured both ways:
    (median absolute difference, median relative difference). A pair's two directions cross the
    same links, so this is the measurement spread of the matrix where nothing else is known;
    (NaN, NaN) without such a pair."""
    n = len(m)
    absd, reld = [], []
    for i in range(n):
        for j in range(i + 1, n):
            a, b = float(m[i, j]), float(m[j, i])
            if np.isfinite(a) and np.isfinite(b) and max(a, b) > 0:
                absd.append(abs(a - b))
                reld.append(abs(a - b) / max(a, b))
    if not absd:
        return float("nan"), float("nan")
    return float(np.median(absd)), float(np.median(reld))
