"""A word on the spread where two serving figures seem to contradict each other (issue 24).

Serve-bench's figures are medians of noisy samples: the decode step at batch B is the median gap
between a request's consecutive tokens while the batch decodes (serve/decode_curve.csv, with
p10/p90 and n), TPOT the median over requests of each request's mean gap
((e2el - ttft) / (tokens - 1), serve/summary.json, with std and n). Two cases read as
contradictions:

- a larger batch that steps faster than a smaller one (decode step 55.2 ms at batch 8, 41.7 ms
  at batch 16), which batching does not do by itself;
- TPOT at concurrency 1 far from the decode step at batch 1 (40.8 ms against 18.2 ms), though
  both time the same gaps.

For each, a note gives the spread and an approximate 95% interval of each median, and says
whether the difference is within that noise or what else differs.

The interval is median +- 1.96 x 1.253 x sigma / sqrt(n) (the large-sample standard error of a
median, 1.253 = sqrt(pi/2) for a normal distribution), with sigma from p10..p90 as if normal
(p90 - p10 = 2.563 sigma) or the recorded std. Assumed, and said so on the page: token gaps of one
request are not independent, so the real interval is wider.
"""

from __future__ import annotations

import math
from typing import Any

from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.report.model import Note

#: TPOT and the decode step at batch 1 further apart than this (relative) get a note.
APART = 0.25
#: z for 95% x the standard error of a median in units of sigma / sqrt(n) (normal case).
_Z95_MEDIAN = 1.96 * math.sqrt(math.pi / 2)
#: p90 - p10 of a normal distribution, in sigmas (2 x 1.2816).
_P10_P90_SIGMAS = 2.563
#: How the page names the interval (what it assumes is in the module docstring).
CI_WORDS = "approximate 95% interval of the median, gaps taken as independent"


def median_interval(median: float, sigma: float, n: int) -> tuple[float, float]:
    """Approximate 95% interval of a median of `n` samples with spread `sigma` (same unit)."""
    half = _Z95_MEDIAN * sigma / math.sqrt(max(n, 1))
    return median - half, median + half


def _step_interval(row: Any) -> tuple[float, float]:
    sigma = (row.step_time_ms_p90 - row.step_time_ms_p10) / _P10_P90_SIGMAS
    return median_interval(row.step_time_ms, sigma, int(row.n_samples))


def _meet(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _ms(r: tuple[float, float]) -> str:
    return f"{r[0]:.1f}..{r[1]:.1f} ms"


def _step_words(row: Any) -> str:
    return (f"{row.step_time_ms:.1f} ms (p10..p90 {row.step_time_ms_p10:.1f}.."
            f"{row.step_time_ms_p90:.1f} ms, n = {row.n_samples}, median within "
            f"{_ms(_step_interval(row))})")


def inversion_notes(curve: Any) -> list[Note]:
    """A note for each batch size whose decode step is faster than the smaller one before it.

    Args:
        curve: serve/decode_curve.csv's ok rows (step_time_ms and its p10/p90 present).
    """
    rows = list(curve.sort_values("batch_size").itertuples())
    notes = []
    for a, b in zip(rows, rows[1:]):
        if b.step_time_ms >= a.step_time_ms:
            continue
        said = (f"decode step: batch {b.batch_size} steps faster than batch {a.batch_size}, which "
                f"a larger batch does not do by itself: batch {a.batch_size} {_step_words(a)}, "
                f"batch {b.batch_size} {_step_words(b)} ({CI_WORDS})")
        if _meet(_step_interval(a), _step_interval(b)):
            said += "; the intervals overlap: the difference is within the noise, read them as equal"
        else:
            said += ("; the intervals do not overlap: not noise alone; measure both again "
                     f"(serve-bench --decode-batches {a.batch_size},{b.batch_size}) before "
                     "relying on either")
        notes.append(Note(said, "warn"))
    return notes


def tpot_note(summary: ServeSummary | None, curve: Any) -> Note | None:
    """A note when TPOT at concurrency 1 and the decode step at batch 1 are more than APART
    apart: their spread, and what else tells them apart."""
    run = next((r for r in (summary.runs if summary else []) if r.concurrency == 1), None)
    one = curve[curve["batch_size"] == 1]
    tpot = run.tpot_ms.get("median") if run else None
    if summary is None or run is None or tpot is None or one.empty:
        return None
    step = next(one.itertuples())
    if abs(tpot - step.step_time_ms) <= APART * step.step_time_ms:
        return None
    n = int(run.tpot_ms.get("n") or run.completed or 1)
    std = run.tpot_ms.get("std")
    tpot_ci = median_interval(tpot, std, n) if std is not None else (tpot, tpot)
    said = (f"TPOT at {run.label}: {tpot:.1f} ms (median of {n} requests, each the mean of its "
            f"token gaps; median within {_ms(tpot_ci)}) against the decode step at batch 1: "
            f"{_step_words(step)}, the median gap ({CI_WORDS})")
    if _meet(tpot_ci, _step_interval(step)):
        return Note(said + "; the intervals overlap: the difference is within the noise", "warn")
    why = []
    skewed = step.step_time_ms_p90 - step.step_time_ms > step.step_time_ms - step.step_time_ms_p10
    if tpot > step.step_time_ms and skewed:
        why.append("the gaps are skewed (p90 further above the median than p10 below it), so "
                   "TPOT, a mean, sits above the median gap")
    if (summary.input_len, summary.output_len) != (step.input_len, step.output_len):
        why.append(f"the two timed different requests: the runs {summary.input_len}-token "
                   f"prompts for {summary.output_len} tokens, the decode curve {step.input_len} "
                   f"for {step.output_len}")
    if not why:
        why.append("neither the skew of the gaps nor the request shape explains it; measure "
                   "both again before relying on either")
    return Note(said + "; not noise alone: " + "; ".join(why), "warn")
