from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders.bundles import REPORT_DATA
from builders.cli import cli

from pcieprof.analysis.decode_band import band_for
from pcieprof.analysis.metrics import bundle_metrics, higher_is_better
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.cards import DEFAULT_CARD
from pcieprof.report import write_report

#: A dense Llama-style model's published config.json (tests/data/cards/NOTE.md).
LLAMA = Path(__file__).resolve().parents[1] / "data" / "cards" / "llama-3.1-70b" / "config.json"


def test_report_command_writes_into_the_bundle(bundle_factory) -> None:
    b = bundle_factory("one")
    r = cli("report", str(b.path), "--no-tune", "-q")
    assert r.returncode == 0, r.stderr
    assert (b.path / "report.html").is_file()
    assert f"report: {b.path / 'report.html'}" in r.stdout


def test_report_command_several_bundles_and_bad_input(bundle_factory, serve_bundle: Path,
                                                       tmp_path: Path) -> None:
    a = bundle_factory("a")
    out = tmp_path / "both.html"
    r = cli("report", str(a.path), str(serve_bundle), "-o", str(out), "-q")
    assert r.returncode == 0, r.stderr
    html = out.read_text(encoding="utf-8")
    assert 'id="serve"' in html and 'id="attribution"' in html and "cols-2" in html
    bad = cli("report", str(tmp_path / "nope"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "not a pcieprof bundle" in bad.stderr


def test_metrics_of_real_bundles(bundle_factory, serve_bundle: Path) -> None:
    band = band_for("glm5-nvfp4")
    m = bundle_metrics(bundle_factory("m"), band)
    assert m["p2p.p2p.bandwidth_gbps.median"] > m["p2p.host_staged.bandwidth_gbps.median"]
    assert "allreduce.default.n8.time_us@96KiB" in m
    s = bundle_metrics(Bundle.open(serve_bundle), band)
    assert s["serve.c=4.output_throughput"] > 0 and "serve.c=1.tpot_ms.median" in s
    assert "serve.decode.bs2.step_time_ms" in s
    assert higher_is_better("p2p.p2p.bandwidth_gbps.median")
    assert not higher_is_better("allreduce.default.n8.time_us@12KiB")


def test_gloo_trace_priced_with_the_gloo_curve(serve_bundle: Path, tmp_path: Path) -> None:
    """The serve bundle's trace (reference server, gloo) next to the analytic model priced with
    a real cpu-backend topology bundle, as `attribute --model --topology --serve` saves it; the
    report draws the saved comm_model.json, and without it says how to make one."""
    topo = tmp_path / "cpu_2rank_topology"
    shutil.copytree(REPORT_DATA / "cpu_2rank_topology", topo)
    out = tmp_path / "priced"
    r = cli("attribute", "--model", "tiny-cpu", "--topology", str(topo), "--serve",
            str(serve_bundle), "--tp", "2", "--batches", "1,8", "-o", str(out), "-q")
    assert r.returncode == 0, r.stderr
    rows = json.loads((out / "comm_model.json").read_text())["table"]
    assert [x["batch"] for x in rows] == [1, 8] and rows[1]["trace_comm_ms"] is not None
    html = write_report([out], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "trace vs analytic model (predicted = collectives x the all-reduce curve of" in html
    assert "cpu_2rank_topology" in html
    alone = write_report([serve_bundle], tmp_path / "a.html").read_text(encoding="utf-8")
    assert "trace vs analytic model: not shown" in alone


def test_report_saves_recommends_result_first_and_draws_what_is_saved(bundle_factory,
                                                                        tmp_path: Path) -> None:
    """A bundle with measurements and no recommendations.json: `report` writes recommend's into
    it (said in one line), then draws the saved document; a second report finds it current and
    writes nothing; a report for another model makes them again for that model."""
    b = bundle_factory("box")
    page = tmp_path / "r.html"
    r = cli("report", str(b.path), "-o", str(page))
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "recommendations.json" in ln]
    assert said == [f"{b.path}: no recommendations.json; writing recommend's into the bundle "
                    "(recommendations.json, tune/), as `pcieprof recommend` would"]
    saved = Bundle.open(b.path)
    doc = saved.read_doc(Recommendations)
    assert doc is not None and doc.model == DEFAULT_CARD and doc.recommendations
    assert (b.path / "tune" / "recommended.env").is_file()
    assert (b.path / "tune" / "sglang_command.sh").is_file()
    part = saved.part("recommendations")
    assert part is not None and part.status == "ok"
    record = saved.model()
    assert record is not None and record.name == DEFAULT_CARD
    html = page.read_text(encoding="utf-8")
    assert 'id="recommendations"' in html and html.count('<div class="rec rec-') >= len(
        [x for x in doc.recommendations if x.kind != "info"])
    # current: nothing is written again
    stamp = (b.path / "recommendations.json").stat().st_mtime_ns
    again = cli("report", str(b.path), "-o", str(tmp_path / "again.html"))
    assert again.returncode == 0 and "recommendations.json" not in again.stderr, again.stderr
    assert (b.path / "recommendations.json").stat().st_mtime_ns == stamp
    # another model: stale, made again for it (and the bundle records that card)
    other = cli("report", str(b.path), "--model", str(LLAMA), "-o", str(tmp_path / "l.html"))
    assert other.returncode == 0, other.stderr
    assert f"recommendations.json was made for {DEFAULT_CARD}, not " in other.stderr
    llama = Bundle.open(b.path)
    doc = llama.read_doc(Recommendations)
    assert doc is not None and doc.model != DEFAULT_CARD
    assert llama.model() is not None and llama.model().name == doc.model


def test_report_of_a_bundle_it_cannot_write_draws_no_recommendations_and_says_why(
        bundle_factory, tmp_path: Path) -> None:
    """A read-only bundle without recommendations.json: the page has no recommendations (nothing
    computed in memory) and says why in one line, as stderr does; the bundle is unchanged."""
    b = bundle_factory("readonly")
    files = sorted(p.name for p in b.path.rglob("*"))
    with _read_only(b.path):
        r = cli("report", str(b.path), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and "no recommendations in the report: no recommendations.json, " \
        "and it cannot be written" in warned[0]
    assert f"pcieprof recommend {b.path} --out DIR" in warned[0]
    assert sorted(p.name for p in b.path.rglob("*")) == files
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'id="recommendations"' not in html and '<div class="rec rec-' not in html
    assert "no recommendations: no recommendations.json, and it cannot be written" in html


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[None]:
    """`path` refuses new files, also to root (the immutable attribute, chattr +i), else by
    its mode; skips where neither holds."""
    immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0 \
        if shutil.which("chattr") else False
    if not immutable:
        path.chmod(0o555)
    try:
        try:
            (path / ".probe").touch()
        except OSError:
            pass
        else:
            (path / ".probe").unlink()
            pytest.skip(f"{path} cannot be made read-only here (root without chattr)")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o755)
