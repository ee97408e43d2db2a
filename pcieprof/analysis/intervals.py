"""Union and overlap of time intervals by class, with numpy (one sort, no Python loop per event).

Every event is an interval [start, end) with a class bit (communication 1, memory 2, compute 4).
A sweep over the sorted start and end points gives, for each set of classes, the time during which
exactly that set is active; unions, overlaps, exposed time and idle time all follow from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COMM_BIT, MEM_BIT, COMP_BIT = 1, 2, 4
_MASK_NAMES = {1: "comm", 2: "memory", 4: "compute", 3: "comm+memory", 5: "comm+compute",
               6: "memory+compute", 7: "comm+memory+compute"}


@dataclass(frozen=True)
class Split:
    """How a window of GPU (or CPU) time divides between classes. All times in microseconds.

    `exclusive[m]` is the time during which exactly the classes of bit mask m are active.
    """

    span_us: float
    exclusive: tuple[float, ...]  # index = mask 0..7 (0 unused)

    def union(self, bit: int) -> float:
        """Time during which class `bit` is active (union over all streams)."""
        return float(sum(v for m, v in enumerate(self.exclusive) if m & bit))

    @property
    def busy_us(self) -> float:
        return float(sum(self.exclusive[1:]))

    @property
    def idle_us(self) -> float:
        return max(0.0, self.span_us - self.busy_us)

    @property
    def comm_us(self) -> float:
        return self.union(COMM_BIT)

    @property
    def compute_us(self) -> float:
        return self.union(COMP_BIT)

    @property
    def memory_us(self) -> float:
        return self.union(MEM_BIT)

    @property
    def comm_overlap_compute_us(self) -> float:
        """Communication time during which some compute runs too."""
        return float(self.exclusive[5] + self.exclusive[7])

    @property
    def exposed_comm_us(self) -> float:
        """Communication time not hidden by any compute."""
        return float(self.exclusive[1] + self.exclusive[3])

    def as_dict(self) -> dict[str, float | None]:
        d: dict[str, float | None] = {
            "span_us": self.span_us, "busy_us": self.busy_us, "idle_us": self.idle_us,
            "comm_us": self.comm_us, "compute_us": self.compute_us, "memory_us": self.memory_us,
            "comm_overlap_compute_us": self.comm_overlap_compute_us,
            "exposed_comm_us": self.exposed_comm_us,
            "comm_overlap_pct": (100.0 * self.comm_overlap_compute_us / self.comm_us
                                 if self.comm_us > 0 else None),
        }
        for m, name in _MASK_NAMES.items():
            d[f"only_{name.replace('+', '_')}_us"] = float(self.exclusive[m])
        return d


def split(start: np.ndarray, end: np.ndarray, bits: np.ndarray,
          window: tuple[float, float] | None = None) -> Split:
    """Exclusive time per class combination over the given intervals.

    Args:
        start: interval starts (us).
        end: interval ends (us), >= start.
        bits: class bit of each interval (1, 2 or 4; 0 = counted in no class).
        window: the span to report idle against; default first start to last end.
    """
    keep = bits > 0
    start, end, bits = start[keep], end[keep], bits[keep].astype(np.int8)
    if start.size == 0:
        span = (window[1] - window[0]) if window else 0.0
        return Split(float(span), (0.0,) * 8)
    t = np.concatenate([start, end])
    order = np.argsort(t, kind="stable")
    ts = t[order]
    mask = np.zeros(ts.size, dtype=np.int8)
    for bit in (COMM_BIT, MEM_BIT, COMP_BIT):
        on = (bits & bit) > 0
        if not on.any():
            continue
        delta = np.concatenate([on.astype(np.int32), -on.astype(np.int32)])[order]
        active = np.cumsum(delta) > 0
        mask |= np.where(active, bit, 0).astype(np.int8)
    seg = np.diff(ts)
    exclusive = np.bincount(mask[:-1], weights=seg, minlength=8)
    span = (window[1] - window[0]) if window else float(ts[-1] - ts[0])
    return Split(float(span), tuple(float(x) for x in exclusive[:8]))


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Total length of the union of intervals (us)."""
    return split(start, end, np.full(start.size, COMM_BIT, dtype=np.int8)).comm_us
