"""The concurrent section says, in a real headless Chromium, whether each measurement's flows were
released together: on a bundle the cpu backend writes now (a real run) and on one written before
the release was recorded (tests/report/data/cpu_2rank_topology)."""

from __future__ import annotations

from pathlib import Path

from builders.browser import page_facts, section_text
from builders.bundles import REPORT_DATA, cpu_copies_bundle
from builders.cuda import CudaStandin, PeerCopies
from pcieprof.analysis.decode_band import band_for
from pcieprof.bundle import Bundle
from pcieprof.bundle.plan import ConcurrentCase, Plan
from pcieprof.report import write_report
from pcieprof.report.console import summarize
from probes.p2p_worker import CudaCopier, concurrent_rows

HEADER = ("pattern/op size flows released together release start skew, us anchor lag bound, us "
          "all flows at once, % of span")


def _drawn(chromium: str, bundle: Path, tmp_path: Path) -> str:
    """The concurrent section's text once the page is drawn (no error, no table cut)."""
    out = write_report([Bundle.open(bundle)], tmp_path / "r.html")
    facts = page_facts(chromium, out, tmp_path)
    assert facts["errors"] == 0 and facts["console"] == 0, facts
    assert facts["figures-rendered"] == facts["figures-expected"] > 0
    assert facts["tables-wide"] == 0, facts["tables-wide-list"]
    return section_text(facts["dom"], "concurrent")


def test_a_cpu_run_shows_each_release_its_skew_and_what_it_means(chromium: str,
                                                                  tmp_path: Path) -> None:
    b = cpu_copies_bundle(tmp_path / "cpu")
    text = _drawn(chromium, b.path, tmp_path)
    print(text)  # the section as a reader sees it (pytest -s)
    assert "how each concurrent measurement's flows were released" in text and HEADER in text
    # 2 ranks: ring has one flow, all_to_all two; the cpu backend holds nothing (a barrier)
    assert "ring/write 1 MiB 1 one flow one flow: nothing to start together 0.0 - 100" in text
    df = b.read_table("concurrent")
    skew = float(df[(df["pattern"] == "all_to_all") & (df["op"] == "write")
                    & (df["flow"] == -1)]["start_skew_us"].iloc[0])
    assert (f"all_to_all/write 1 MiB 2 no not held: each process starts its flows' threads "
            f"after a barrier {skew:.1f} -") in text
    assert ("2 of 2 concurrent measurement(s) with several flows were not released together "
            "(all_to_all/write, all_to_all/read)") in text
    assert "lower bound on contention" in text and "not recorded" not in text
    line = next(ln for ln in summarize(b, band_for()).splitlines()
                if ln.startswith("concurrent release:"))
    assert line.startswith("concurrent release: 0 of 2 (several flows) released together, 2 not")


def test_an_old_bundle_renders_and_says_not_recorded(chromium: str, tmp_path: Path) -> None:
    text = _drawn(chromium, REPORT_DATA / "cpu_2rank_topology", tmp_path)
    assert HEADER in text
    assert ("all_to_all/write 8 MiB 2 not recorded not recorded not recorded not recorded "
            "not recorded") in text
    assert "how the flows were released is not recorded in this bundle" in text
    assert "were not released together" not in text


def test_a_host_flag_round_shows_its_bound_and_no_warning(tmp_path: Path) -> None:
    # rows the cuda copier wrote on the CUDA stand-in: device 1 sees the host's write 3 us late,
    # acknowledgements are read 1 us after each anchor (bounds 1 and 4 us)
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 << 10, 3)
    api = CudaStandin([0, 1], flag_lag_us={1: 3.0}, ack_us=1.0)
    spans, ok, why, timing = CudaCopier(Plan(backend="cuda", devices=[0, 1]), api,
                                        PeerCopies()).run_concurrent(0, case)
    b = Bundle.create(tmp_path / "cuda", command="topology", source="measured", backend="cuda")
    b.append_rows("concurrent", concurrent_rows(case, "cuda", spans, ok, why, timing=timing))
    skew = float(b.read_table("concurrent")["start_skew_us"].max())
    out = write_report([b], tmp_path / "r.html")
    text = section_text(out.read_text(encoding="utf-8"), "concurrent")
    assert f"ring/write 64 KiB 2 yes host flag {skew:.1f} 4.0" in text
    assert "were not released together" not in text and "not recorded in this bundle" not in text
    line = next(ln for ln in summarize(b, band_for()).splitlines()
                if ln.startswith("concurrent release:"))
    assert line == (f"concurrent release: 1 of 1 (several flows) released together, start skew "
                    f"up to {skew:.1f} us, anchors within 4.0 us of the release")
