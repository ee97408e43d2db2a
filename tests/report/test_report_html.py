from __future__ import annotations

import re
from pathlib import Path

from report_fixtures import report_with_advice

from pcieprof.bundle import Bundle
from pcieprof.report import write_report

HOSTILE = "<script>alert('pwn')</script>"


def test_report_is_self_contained_with_plotly_once(bundle_factory, tmp_path: Path) -> None:
    b = bundle_factory("calib")
    out = write_report([b.path], tmp_path / "r.html")
    html = out.read_text(encoding="utf-8")
    # plotly.js inlined exactly once; no network references
    assert html.count("Plotly.newPlot") >= 7
    assert len(re.findall(r"\*\s*plotly\.js v\d", html)) == 1
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<(link|img|iframe)[^>]+(src|href)=\"https?:", html)
    for title in ("p2p: unidirectional bandwidth", "host_staged: latency",
                  "bandwidth ratio p2p / host_staged", "all-reduce latency over 8 ranks",
                  "all-reduce busbw over 8 ranks"):
        assert title in html, title
    # provenance on the first screen and in figure titles
    assert "imported numbers, backend imported" in html
    assert html.count("imported, backend imported") >= 7
    # decode band for GLM-5 hidden 6144, batch 1..64
    assert "12 KiB..768 KiB" in html


def test_bundle_text_is_escaped(bundle_factory, tmp_path: Path) -> None:
    b = bundle_factory("hostile", host=HOSTILE, gpu_name=HOSTILE)
    html = report_with_advice([b.path], tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'id="summary"' in html  # the tuner's text (host names in evidence) is escaped too
    assert HOSTILE not in html
    assert "&lt;script&gt;alert(" in html


def test_absent_parts_say_not_measured(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "empty", command="topology", source="measured", backend="cpu")
    html = write_report([b], tmp_path / "r.html").read_text(encoding="utf-8")
    assert html.count("not measured") >= 3  # machine, p2p, all-reduce
    assert "backend cpu (this machine" in html


def test_several_bundles_side_by_side(bundle_factory, tmp_path: Path) -> None:
    a = bundle_factory("before")
    b = bundle_factory("after", tuned=True)
    html = write_report([a.path, b.path], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "cols-2" in html and 'id="compare"' in html
    assert "calib-box: before" in html and "calib-box: after" in html
