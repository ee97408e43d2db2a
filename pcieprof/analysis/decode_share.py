"""The communication share of a decode step, as traced: the one place it is computed.

A step's share is averaged the same way everywhere (the summary's headline, the analytic model's
comparison per batch): per rank the mean over its DECODE steps, then the mean over ranks, so a
rank with more traced steps does not weigh more, and the share is the mean communication over the
mean span. pcieprof.analysis.attribution saves it in attribution.json (`decode_share`,
`decode_share_by_batch`); the report reads it from there.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pcieprof.bundle.attribution import DecodeShare, StepAttribution

#: The per-step times averaged (StepAttribution fields, microseconds).
_TIMES = ("span_us", "comm_us", "exposed_comm_us", "idle_us")


def decode_share(steps: Iterable[StepAttribution], batch: int | None = None) -> DecodeShare | None:
    """The share of `steps`' DECODE steps (of batch `batch`, or all) spent communicating.

    Args:
        steps: the trace's steps (attribution.json `steps`).
        batch: only the steps of this batch size; None: every DECODE step with a span.

    Returns:
        The mean step split (see the module docstring), or None when no step qualifies.
    """
    by_rank: dict[int, list[StepAttribution]] = {}
    for s in steps:
        if s.kind == "DECODE" and s.span_us and (batch is None or s.bs == batch):
            by_rank.setdefault(int(s.rank), []).append(s)
    if not by_rank:
        return None
    per_rank = [{k: float(np.mean([getattr(s, k) or 0.0 for s in ss])) for k in _TIMES}
                for ss in by_rank.values()]
    mean = {k: float(np.mean([r[k] for r in per_rank])) for k in _TIMES}
    return DecodeShare(batch=batch, steps=sum(len(ss) for ss in by_rank.values()),
                       ranks=len(by_rank), **mean)


def decode_shares(steps: list[StepAttribution]) -> tuple[DecodeShare | None, list[DecodeShare]]:
    """Every DECODE step's share, then one per batch size the step annotations name."""
    batches = sorted({int(s.bs) for s in steps if s.kind == "DECODE" and s.bs is not None})
    per_batch = [d for b in batches if (d := decode_share(steps, b)) is not None]
    return decode_share(steps), per_batch
