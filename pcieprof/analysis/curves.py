"""All-reduce curves from allreduce.csv: per variant, time against size, and lookups on them."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: Below this size an all-reduce is latency-bound: its time is flat, so the smallest measured
#: size's time stands for smaller ones (NCCL's LL floor; 4-64 KiB on PCIe boxes, calibration).
FLOOR_MAX_BYTES = 64 << 10

#: Environment keys every launch carries for logging; they do not make a variant.
_LOGGING_KEYS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "CUDA_DEVICE_ORDER",
                 "CUDA_VISIBLE_DEVICES")


@dataclass
class Curve:
    """One variant over one group: median time per size.

    Attributes:
        variant: the `variant` column.
        env: the variant's settings (logging keys removed).
        nranks: group size.
        ranks: ranks in ring order ("0,1,2,3").
        backend: the backend of its rows.
        time_us: size_bytes -> median time (us), sorted by size.
        busbw_gbps: size_bytes -> median busbw (GB/s).
    """

    variant: str
    env: dict[str, str]
    nranks: int
    ranks: str
    backend: str
    time_us: pd.Series
    busbw_gbps: pd.Series

    def at(self, size: float) -> float:
        """Time (us) at `size` bytes, log-log interpolated inside the measured sizes.

        Below the smallest measured size the time is that size's time (the latency floor) only
        when that size is small (<= FLOOR_MAX_BYTES); otherwise, and above the largest size,
        NaN: a curve is never extrapolated into sizes it does not describe.
        """
        t = self.time_us.dropna()
        if t.empty or size > t.index.max():
            return float("nan")
        if size < t.index.min() and t.index.min() > FLOOR_MAX_BYTES:
            return float("nan")
        return interp_loglog(self.time_us, size)

    def busbw_at(self, size: float) -> float:
        return interp_loglog(self.busbw_gbps, size)

    @property
    def max_size(self) -> int:
        return int(self.time_us.index.max())

    def covers(self, lo: float, hi: float) -> bool:
        """True when the measured sizes reach at least from lo to hi (no extrapolation)."""
        return bool(len(self.time_us)) and self.time_us.index.min() <= lo and self.time_us.index.max() >= hi


def interp_loglog(curve: pd.Series, size: float) -> float:
    """Value at `size` from a size-indexed series, log-log interpolated (clamped at the ends)."""
    c = curve.dropna()
    c = c[c > 0]
    if c.empty:
        return float("nan")
    xs = np.log(c.index.to_numpy(dtype=float))
    ys = np.log(c.to_numpy(dtype=float))
    return float(np.exp(np.interp(np.log(size), xs, ys)))


def parse_env(text: str) -> dict[str, str]:
    try:
        env = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {k: str(v) for k, v in (env or {}).items() if k not in _LOGGING_KEYS}


def curves(ar: pd.DataFrame, *, dtype: str | None = "bf16") -> list[Curve]:
    """Every (variant, ranks) curve of ok rows; one dtype (bf16 by default, else whatever exists)."""
    ok = ar[(ar["status"] == "ok") & ar["time_us"].notna() & (ar["size_bytes"] > 0)]
    if ok.empty:
        return []
    if dtype is not None and (ok["dtype"] == dtype).any():
        ok = ok[ok["dtype"] == dtype]
    elif dtype is not None and ok["dtype"].nunique() > 1:
        ok = ok[ok["dtype"] == ok["dtype"].iloc[0]]
    out = []
    for (variant, ranks), g in ok.groupby(["variant", "ranks"], sort=True):
        med = g.groupby("size_bytes")[["time_us", "busbw_gbps"]].median().sort_index()
        out.append(Curve(variant=str(variant), env=parse_env(str(g["env"].iloc[0])),
                         nranks=int(g["nranks"].iloc[0]), ranks=str(ranks),
                         backend=str(g["backend"].iloc[0]), time_us=med["time_us"],
                         busbw_gbps=med["busbw_gbps"]))
    return out


def full_group(cs: list[Curve]) -> list[Curve]:
    """Curves over the largest group."""
    if not cs:
        return []
    n = max(c.nranks for c in cs)
    return [c for c in cs if c.nranks == n]


def find(cs: list[Curve], env: dict[str, str] | None = None, *, variant: str | None = None,
         nranks: int | None = None, ranks: str | None = None) -> Curve | None:
    """The curve whose env is exactly `env` (or named `variant`), over the largest group unless
    `nranks`/`ranks` say otherwise. `env={}` finds the default."""
    pool = [c for c in cs if (nranks is None or c.nranks == nranks) and (ranks is None or c.ranks == ranks)]
    if nranks is None and ranks is None:
        pool = full_group(pool)
    if variant is not None:
        hits = [c for c in pool if c.variant == variant]
    else:
        hits = [c for c in pool if c.env == (env or {})]
        if env == {} and not hits:
            hits = [c for c in pool if c.variant == "default"]
    if not hits:
        return None
    # prefer the identity ring order (the plain launch) among several orders
    hits.sort(key=lambda c: (c.ranks != ",".join(str(i) for i in range(c.nranks)), c.ranks))
    return hits[0]
