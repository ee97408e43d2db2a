"""Serving figures that seem to contradict each other get a word on their spread (issue 24).

The committed tiny-cpu run (tests/report/data/tiny_cpu_serve, real) has both cases: its decode
step at batch 4 (16.5 ms) is faster than at batch 2 (20.4 ms), and its TPOT at c=1 (24.3 ms) is
29% above its decode step at batch 1 (18.8 ms). The verdicts' other branches are checked on that
curve with one row changed.
"""

from __future__ import annotations

import pandas as pd
from builders.bundles import REPORT_DATA

from pcieprof.bundle import Bundle
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.report.builder import open_views
from pcieprof.report.context import ReportContext
from pcieprof.report.sections import serve
from pcieprof.report.sections.serve_spread import inversion_notes, median_interval, tpot_note

SERVE = REPORT_DATA / "tiny_cpu_serve"


def _curve() -> pd.DataFrame:
    return pd.read_csv(SERVE / "serve" / "decode_curve.csv")


def test_the_serve_section_says_the_inverted_step_and_the_tpot_gap_are_within_the_noise() -> None:
    sec = serve.build(open_views([SERVE])[0], ReportContext())
    assert sec is not None
    warns = [b.text for b in sec.blocks if getattr(b, "level", "") == "warn"]
    inverted = [w for w in warns if w.startswith("decode step: batch 4 steps faster than batch 2")]
    assert len(inverted) == 1, warns
    # the spread as the CSV has it: medians, p10..p90 and n of both batch sizes
    assert "batch 2 20.4 ms (p10..p90 14.6..33.9 ms, n = 29" in inverted[0]
    assert "batch 4 16.5 ms (p10..p90 14.1..18.8 ms, n = 57" in inverted[0]
    assert inverted[0].endswith("within the noise, read them as equal")
    tpot = [w for w in warns if w.startswith("TPOT at c=1: 24.3 ms")]
    assert len(tpot) == 1 and "decode step at batch 1: 18.8 ms" in tpot[0], warns
    assert "gaps taken as independent" in tpot[0]  # the interval says what it assumes


def test_intervals_that_do_not_meet_ask_for_a_new_measurement() -> None:
    curve = _curve()
    # batch 4 as tight as measured, batch 2 sampled ten times as often: no longer within the noise
    curve.loc[curve["batch_size"] == 2, "n_samples"] = 290
    notes = inversion_notes(curve)
    assert len(notes) == 1
    assert "the intervals do not overlap" in notes[0].text
    assert "serve-bench --decode-batches 2,4" in notes[0].text


def test_a_monotonic_curve_has_no_note() -> None:
    curve = _curve()
    curve.loc[curve["batch_size"] == 4, "step_time_ms"] = 21.0
    assert inversion_notes(curve) == []


def test_tpot_far_outside_the_noise_names_the_skew_and_the_request_shapes() -> None:
    summary = Bundle.open(SERVE).read_doc(ServeSummary)
    assert summary is not None
    curve = _curve()
    one = curve["batch_size"] == 1
    # the step at batch 1 measured tightly around 10 ms, its tail long (right-skewed)
    curve.loc[one, ["step_time_ms", "step_time_ms_p10", "step_time_ms_p90", "n_samples"]] = \
        [10.0, 9.5, 14.0, 400]
    note = tpot_note(summary, curve)
    assert note is not None
    assert "not noise alone" in note.text
    assert "the gaps are skewed" in note.text
    # the runs sent 128-token prompts for 16 tokens, the curve 16 for 16
    assert "the runs 128-token prompts for 16 tokens, the decode curve 16 for 16" in note.text


def test_close_tpot_and_step_have_no_note() -> None:
    summary = Bundle.open(SERVE).read_doc(ServeSummary)
    curve = _curve()
    curve.loc[curve["batch_size"] == 1, "step_time_ms"] = 23.0  # within 25% of TPOT's 24.3
    assert tpot_note(summary, curve) is None


def test_the_median_interval_narrows_with_the_square_root_of_n() -> None:
    lo1, hi1 = median_interval(10.0, 2.0, 25)
    lo4, hi4 = median_interval(10.0, 2.0, 100)
    assert lo1 < 10.0 < hi1 and abs((hi1 - lo1) / (hi4 - lo4) - 2.0) < 1e-9
