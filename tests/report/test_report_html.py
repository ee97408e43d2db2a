from __future__ import annotations

import json
import re
import socket
import zlib
from pathlib import Path

from plotly.offline import get_plotlyjs
from builders.browser import report_with_advice
from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.report import write_report
from pcieprof.report.builder import drop_empty_columns, fold_notes
from pcieprof.report.model import Note, NoteGroup, Table
from pcieprof.report.page import unpack7

DATA = Path(__file__).resolve().parents[1] / "data"
HOSTILE = "<script>alert('pwn')</script>"


def test_report_is_self_contained_with_plotly_once(bundle_factory, tmp_path: Path) -> None:
    b = bundle_factory("calib")
    out = write_report([b.path], tmp_path / "r.html")
    html = out.read_text(encoding="utf-8")
    # plotly.js inlined exactly once (packed: it unpacks to the installed plotly.js); every
    # figure is a spec in the one JSON block with its plot <div>; no network references
    assert len(re.findall(r"\*\s*plotly\.js v\d", html)) == 1
    packed = re.search(r'id="pcieprof-plotly" data-bytes="(\d+)"[^>]*>/\*[^*]*\*/(.*?)</script>',
                       html, re.S)
    assert packed and packed.group(2).count("</") == 0
    js = zlib.decompress(unpack7(packed.group(2), int(packed.group(1))), -15).decode("utf-8")
    assert js == get_plotlyjs()
    figures = json.loads(re.search(r'id="pcieprof-figures">(.*?)</script>', html, re.S).group(1))
    assert len(figures["figures"]) >= 7
    for f in figures["figures"]:
        assert f'<div class="plot" id="{f["id"]}"' in html
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<(link|img|iframe)[^>]+(src|href)=\"https?:", html)
    for title in ("p2p: unidirectional bandwidth", "host_staged: latency",
                  "bandwidth ratio p2p / host_staged", "all-reduce latency over 8 ranks",
                  "all-reduce busbw over 8 ranks"):
        assert title in html, title
    # provenance on the first screen and in figure titles
    # imported: the manifest's host ran the import; these files name no box
    assert ("<b>calib</b>: imported: tool outputs of a box the files do not name; imported on "
            "host calib-box (not the box), backend imported") in html
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
    assert "measured on host " in html and "backend cpu (CPUs and host memory, not GPUs)" in html


def test_several_bundles_side_by_side(bundle_factory, tmp_path: Path) -> None:
    a = bundle_factory("before")
    b = bundle_factory("after", tuned=True)
    html = write_report([a.path, b.path], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "cols-2" in html and 'id="compare"' in html
    # each bundle is named by its directory, and its provenance says which host it came from
    assert '<h3 class="col-label">before</h3>' in html and '<h3 class="col-label">after</h3>' in html
    for name in ("before", "after"):
        assert (f"<b>{name}</b>: imported: tool outputs of a box the files do not name; "
                "imported on host calib-box (not the box), backend imported") in html


def test_empty_table_columns_are_dropped_and_long_tables_folded() -> None:
    rows = [[1, None, "", float("nan"), "x"]] + [[i, None, "", float("nan"), None] for i in range(20)]
    t = Table("t", ["a", "none", "blank", "nan", "sometimes"], rows)
    drop_empty_columns(t)
    assert t.columns == ["a", "sometimes"] and t.rows[0] == [1, "x"] and len(t.rows) == 21


def test_runs_of_notes_are_folded_but_never_warnings() -> None:
    notes = [Note(f"n{i}") for i in range(4)] + [Note("w1", "warn"), Note("w2", "warn"),
                                                 Note("w3", "warn"), Note("m1", "missing")]
    folded = fold_notes(notes)
    assert isinstance(folded[0], NoteGroup) and [n.text for n in folded[0].notes] == ["n0", "n1", "n2", "n3"]
    assert [getattr(b, "text", None) for b in folded[1:]] == ["w1", "w2", "w3", "m1"]


def test_an_imported_bundle_names_the_box_apart_from_the_machine_that_imported_it(
        tmp_path: Path) -> None:
    # a real NCCL log (tests/data/importers/NOTE.md): its lines start with the box's host name
    log = DATA / "importers" / "nccl_log_2.29.2_2rank_socket_warn_timestamp.log"
    r = cli("import", str(log), "--out", str(tmp_path / "box"), "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    html = write_report([tmp_path / "box"], tmp_path / "r.html").read_text(encoding="utf-8")
    header = html[html.index("<header"):html.index("</header>")]
    assert ("tool outputs of box VM-16-64-ubuntu (as its NCCL log names it); imported on host "
            f"{socket.gethostname()} (not the box)") in header
    assert f"imported on host {socket.gethostname()}, " not in html  # never as if it were the box
    machine = re.search(r'<section id="machine">(.*?)</section>', html, re.S).group(1)
    assert "box VM-16-64-ubuntu" in machine  # the machine's host line says the same
