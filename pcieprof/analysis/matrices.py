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
    for (src, dst), grp in rows.groupby(["src", "dst"]):
        if int(src) not in pos or int(dst) not in pos:
            continue
        size = grp["size_bytes"].max() if metric == "bandwidth_gbps" else grp["size_bytes"].min()
        m[pos[int(src)], pos[int(dst)]] = float(grp[grp["size_bytes"] == size][metric].median())
    return m


def pair_status(p2p: pd.DataFrame, *, path: str, gpus: list[int]) -> dict[tuple[int, int], str]:
    """Non-ok statuses per (src, dst) for one path (e.g. `error` for wrong bytes, `hang`)."""
    bad = p2p[(p2p["path"] == path) & (p2p["status"] != "ok")]
    out: dict[tuple[int, int], str] = {}
    for _, r in bad.iterrows():
        out[(int(r["src"]), int(r["dst"]))] = str(r["status"])
    return {k: v for k, v in out.items() if k[0] in gpus and k[1] in gpus}
