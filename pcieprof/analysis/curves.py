"""All-reduce curves from allreduce.csv (time against message size per variant and group), and the
one rule for reading a time off a curve.

Every place that quotes an all-reduce time (console summary, report, tuner, analytic comm model,
compare metrics) reads it with `Curve.at`, so one question gets one answer:
- at a measured size: the median time of that size's rows;
- between measured sizes: log-log interpolation (a power law between the two neighbours);
- below the smallest measured size: that size's time, the latency floor, when the smallest size
  is latency-bound (at most FLOOR_MAX_BYTES); else unknown (NaN), because a curve measured only
  in the bandwidth regime says nothing about latency;
- above the largest measured size: the largest size's time scaled linearly with size (the bus
  bandwidth reached there taken as the asymptote). `Curve.covers(size)` is False there, and
  callers that must not act on an extrapolation (the tuner's gains, compare metrics) skip such
  sizes; `Curve.extent(size)` says which case a number is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np
import pandas as pd

#: Below this size an all-reduce is latency-bound: its time is flat, so the smallest measured
#: size's time stands for smaller ones (NCCL's LL floor; 4-64 KiB on PCIe boxes, calibration).
FLOOR_MAX_BYTES = 64 << 10

#: Environment keys every launch carries for logging; they do not make a variant.
LOGGING_KEYS = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE",
                          "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES"})

MEASURED, INTERPOLATED, FLOOR, EXTRAPOLATED, UNKNOWN = (
    "measured", "interpolated", "floor", "extrapolated", "unknown")


@dataclass(frozen=True, eq=False)
class Curve:
    """One variant over one group in one dtype: the median time per measured size.

    Attributes:
        variant: the `variant` column.
        env: the variant's settings (logging keys removed).
        ranks: devices in ring order.
        backend: the backend of its rows.
        dtype: the rows' dtype.
        time_us: size_bytes -> median time (us), sorted by size.
        busbw_gbps: size_bytes -> median busbw (GB/s).
    """

    variant: str
    env: Mapping[str, str]
    ranks: tuple[int, ...]
    backend: str
    dtype: str
    time_us: pd.Series
    busbw_gbps: pd.Series

    @property
    def nranks(self) -> int:
        return len(self.ranks)

    @property
    def plain_order(self) -> bool:
        """True when the ring runs in ascending device order (a plain launch)."""
        return list(self.ranks) == sorted(self.ranks)

    @property
    def min_size(self) -> int:
        return int(self.time_us.index.min())

    @property
    def max_size(self) -> int:
        return int(self.time_us.index.max())

    def extent(self, size: float) -> str:
        """Which rule gives the time at `size`: measured, interpolated, floor, extrapolated,
        or unknown (below a curve that starts above FLOOR_MAX_BYTES)."""
        if size in self.time_us.index:
            return MEASURED
        if size > self.max_size:
            return EXTRAPOLATED
        if size < self.min_size:
            return FLOOR if self.min_size <= FLOOR_MAX_BYTES else UNKNOWN
        return INTERPOLATED

    def covers(self, size: float) -> bool:
        """True when the time at `size` is measured, interpolated or the latency floor."""
        return self.extent(size) in (MEASURED, INTERPOLATED, FLOOR)

    def at(self, size: float) -> float:
        """Time (us) of an all-reduce of `size` bytes by the module's rule (NaN when unknown)."""
        how = self.extent(size)
        if how == UNKNOWN:
            return float("nan")
        if how == EXTRAPOLATED:
            return float(self.time_us.iloc[-1]) * size / self.max_size
        return _interp_loglog(self.time_us, size)

    def busbw_at(self, size: float) -> float:
        """Bus bandwidth (GB/s) at `size`: log-log interpolated, constant beyond the ends."""
        return _interp_loglog(self.busbw_gbps, size)


def _interp_loglog(curve: pd.Series, size: float) -> float:
    c = curve.dropna()
    c = c[c > 0]
    if c.empty:
        return float("nan")
    xs = np.log(c.index.to_numpy(dtype=float))
    ys = np.log(c.to_numpy(dtype=float))
    return float(np.exp(np.interp(np.log(size), xs, ys)))


def variant_env(env: Mapping[str, str]) -> dict[str, str]:
    """A row's environment without the logging keys every launch carries."""
    return {k: str(v) for k, v in env.items() if k not in LOGGING_KEYS}


class Curves:
    """Every curve of one bundle's all-reduce rows (status ok, one dtype), and lookups on them.

    Args:
        rows: the allreduce table (`Bundle.read_table("allreduce")`).
        dtype: the dtype to keep (bf16 by default: decode all-reduces are bf16); when absent,
            the first dtype of the rows.
    """

    def __init__(self, rows: pd.DataFrame, dtype: str = "bf16") -> None:
        ok = rows[(rows["status"] == "ok") & rows["time_us"].notna() & (rows["size_bytes"] > 0)]
        self.curves: list[Curve] = []
        if ok.empty:
            return
        ok = ok[ok["dtype"] == (dtype if (ok["dtype"] == dtype).any() else ok["dtype"].iloc[0])]
        for (variant, ranks), g in ok.groupby(["variant", "ranks"], sort=True):
            med = g.groupby("size_bytes")[["time_us", "busbw_gbps"]].median().sort_index()
            self.curves.append(Curve(
                variant=str(variant), env=variant_env(g["env"].iloc[0]), ranks=tuple(ranks),
                backend=str(g["backend"].iloc[0]), dtype=str(g["dtype"].iloc[0]),
                time_us=med["time_us"], busbw_gbps=med["busbw_gbps"]))

    def __iter__(self) -> Iterator[Curve]:
        return iter(self.curves)

    def __len__(self) -> int:
        return len(self.curves)

    @property
    def max_nranks(self) -> int:
        return max((c.nranks for c in self.curves), default=0)

    @property
    def backend(self) -> str:
        """The backend of every curve, `mixed`, or `none` without curves."""
        bs = {c.backend for c in self.curves}
        return bs.pop() if len(bs) == 1 else ("mixed" if bs else "none")

    def full_group(self) -> list[Curve]:
        """Curves over the largest group."""
        return [c for c in self.curves if c.nranks == self.max_nranks]

    def find(self, env: Mapping[str, str] | None = None, *, variant: str | None = None,
             nranks: int | None = None, ranks: tuple[int, ...] | None = None) -> Curve | None:
        """The curve whose env is exactly `env` (or named `variant`), over the largest group
        unless `nranks` / `ranks` say otherwise; the plain ring order first among several."""
        if ranks is not None:
            pool = [c for c in self.curves if c.ranks == tuple(ranks)]
        else:
            n = self.max_nranks if nranks is None else nranks
            pool = [c for c in self.curves if c.nranks == n]
        if variant is not None:
            hits = [c for c in pool if c.variant == variant]
        else:
            hits = [c for c in pool if dict(c.env) == dict(env or {})]
        hits.sort(key=lambda c: (not c.plain_order, c.ranks))
        return hits[0] if hits else None

    def default(self, nranks: int | None = None) -> Curve | None:
        """The default curve: no environment set (the variant named `default` first), plain
        ring order, over the largest group unless `nranks` says otherwise."""
        return self.find(variant="default", nranks=nranks) or self.find({}, nranks=nranks)

    def nearest_group(self, nranks: int) -> int:
        """The group size closest to `nranks` that has curves (the larger one on a tie), 0 when
        there are none."""
        have = sorted({c.nranks for c in self.curves})
        return min(have, key=lambda k: (abs(k - nranks), -k)) if have else 0
