"""Whether concurrent measurements ran their flows at once (pcieprof.analysis.concurrent_release):
rows written by the cuda copier against the CUDA stand-in (tests/builders/cuda.py), read back
from a bundle, and the real cpu bundle of tests/report/data written before the columns existed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builders.bundles import REPORT_DATA
from builders.cuda import CudaStandin, PeerCopies
from pcieprof.analysis.concurrent_release import not_together_sentence, releases, summary_line
from pcieprof.bundle import Bundle
from pcieprof.bundle.plan import ConcurrentCase, Plan
from probes.p2p_worker import CudaCopier, Round, concurrent_rows
from probes.plan import KiB

RING = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 * KiB, 3)


def _cuda_bundle(path: Path, *, flag_already_written: bool = False, **kw: Any) -> Bundle:
    """One concurrent case timed by the cuda copier on the stand-in, its rows in a bundle."""
    api = CudaStandin([0, 1], **kw)
    copier = CudaCopier(Plan(backend="cuda", devices=[0, 1]), api, PeerCopies())
    if flag_already_written:  # as when the timer wrote the flag: no stream waits
        api.flags[0].value = 1 << 20
    spans, ok, why, timing = copier.run_concurrent(0, RING)
    b = Bundle.create(path, command="topology", source="measured", backend="cuda")
    b.append_rows("concurrent", concurrent_rows(RING, "cuda", spans, ok, why, timing=timing))
    return b


def test_a_host_flag_round_is_released_together_with_its_skew_and_bound(tmp_path: Path) -> None:
    # device 1 sees the host's write 3 us late and each acknowledgement is read 1 us after its
    # anchor: the bounds are 1 and 4 us, the measurement's the larger
    b = _cuda_bundle(tmp_path / "b", flag_lag_us={1: 3.0}, ack_us=1.0)
    [r] = releases(b)
    assert (r.name, r.flows, r.release, r.held, r.together) == ("ring/write", 2, "host_flag",
                                                                True, True)
    assert r.lag_bound_us == pytest.approx(4.0)
    df = b.read_table("concurrent")
    assert r.start_skew_us == pytest.approx(float(df["start_skew_us"].max()))
    assert r.overlap is not None and 0.0 < r.overlap <= 1.0
    assert r.how() == "host flag" and r.together_text() == "yes"
    assert not_together_sentence([r]) == ""
    assert "1 of 1 (several flows) released together" in summary_line([r])
    assert "anchors within 4.0 us of the release" in summary_line([r])


def test_a_round_the_flag_did_not_hold_is_not_together_and_says_why(tmp_path: Path) -> None:
    b = _cuda_bundle(tmp_path / "b", flag_already_written=True)
    [r] = releases(b)
    assert r.held is False and r.together is False and r.lag_bound_us is None
    assert "hold ended before every copy was queued" in r.how()
    text = not_together_sentence([r])
    assert text.startswith("1 of 1 concurrent measurement(s) with several flows were not "
                           "released together (ring/write)")
    assert "lower bound on contention" in text and "include host queueing" in text
    assert "1 not: their slowdown is a lower bound on contention" in summary_line([r])


def test_the_gate_event_is_together_with_its_anchors_assumed_simultaneous(tmp_path: Path) -> None:
    [r] = releases(_cuda_bundle(tmp_path / "b", host_flag=False))
    assert (r.release, r.together, r.lag_bound_us) == ("gate_event", True, None)
    assert "assumed simultaneous" in r.how()


def test_overlap_is_the_share_of_the_span_with_every_flow_copying(tmp_path: Path) -> None:
    # flow 1 starts 1 ms after flow 0; 2e6 bytes each at 2 GB/s = 1 ms: they never overlap, and
    # the span (first start to last end) is 2 ms, as the aggregate's 2 GB/s over 4e6 bytes says
    case = ConcurrentCase("all_to_all", "write", [(0, 1), (1, 0)], 1_000_000, 2)
    spans = [(0.0, 0.001), (0.001, 0.002)]
    b = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    b.append_rows("concurrent", concurrent_rows(case, "cpu", spans, [True, True],
                                                timing=Round(spans, None, "barrier")))
    [r] = releases(b)
    assert r.start_skew_us == pytest.approx(1000.0) and r.span_us == pytest.approx(2000.0)
    assert r.overlap == pytest.approx(0.0) and r.together is False
    assert "as little as 0% of the span" in not_together_sentence([r])


def test_a_bundle_written_before_the_columns_says_not_recorded() -> None:
    # a real `pcieprof topology --backend cpu` bundle of 2026-12-02, without release columns
    rel = releases(Bundle.open(REPORT_DATA / "cpu_2rank_topology"))
    assert len(rel) == 4
    several = [r for r in rel if r.flows > 1]
    assert several and all(r.together is None and r.together_text() == "not recorded"
                           and r.how() == "not recorded" for r in several)
    assert all(r.together_text() == "one flow" for r in rel if r.flows == 1)
    assert not_together_sentence(rel) == ""
    assert summary_line(rel) == "concurrent release: not recorded"
