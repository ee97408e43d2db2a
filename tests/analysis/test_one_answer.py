"""One question, one answer: every place that shows "the 8-GPU all-reduce at the decode size"
gives the same number on the demo's bundles (the simulated rtxpro6000-8x-vm box and its
bare-metal twin rtxpro6000-8x-switch, made as `pcieprof demo` makes them)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from builders.bundles import REPORT_DATA
from builders.cli import cli

from pcieprof.analysis.comm_model import ALL_REDUCE, Layout, Pricer, predict_step_comm
from pcieprof.analysis.curves import Curves
from pcieprof.analysis.decode_band import band_for
from pcieprof.analysis.decode_share import decode_share, decode_shares
from pcieprof.analysis.metrics import bundle_metrics
from pcieprof.bundle import Bundle
from pcieprof.bundle.attribution import Attribution
from pcieprof.cards import load_card
from pcieprof.commands.recommend import save_for_report
from pcieprof.report import ReportContext
from pcieprof.report.builder import build_sections, open_views
from pcieprof.report.console import summarize
from pcieprof.report.model import Note, Table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo_copies(demo_bundles: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """Copies of the demo's bundles (`recommend` writes into the bundle it reads)."""
    out = {}
    for profile, path in demo_bundles.items():
        out[profile] = tmp_path / path.name
        shutil.copytree(path, out[profile])
    return out


def _answers(path: Path, tmp_path: Path) -> dict[str, str | float]:
    """What each place says, as it says it (numbers, or the text they print)."""
    band = band_for("glm5-nvfp4")
    size = band.lo_bytes
    b = Bundle.open(path)
    got: dict[str, str | float] = {}
    # the console summary printed by `pcieprof topology`
    text = summarize(b, band)
    head = next(ln for ln in text.splitlines() if ln.startswith("variant"))
    col = head.split().index("12") if "12" in head.split() else None
    assert col is not None, head
    row = next(ln for ln in text.splitlines() if ln.startswith("default "))
    got["console"] = row.split()[col]  # "12 KiB" is two words in the header, one column
    # pcieprof recommend: the principal bottleneck on stdout and in recommendations.json
    r = cli("recommend", str(path), "--no-layouts", "-q")
    assert r.returncode == 0, r.stderr
    m = re.search(r"decode sizes: ([\d.]+) us per 8-GPU all-reduce of 12 KiB", r.stdout)
    assert m, r.stdout[:400]
    got["recommend stdout"] = m.group(1)
    doc = json.loads((path / "recommendations.json").read_text())
    got["recommendations.json"] = re.search(r"decode sizes: ([\d.]+) us", doc["bottleneck"]).group(1)
    # the report: the all-reduce section's decode table and the summary's headline
    views = open_views([path])
    ctx = ReportContext(band=band, unsaved=save_for_report([b], load_card(band.model), band))
    rows = {s.id: s for s in (col for r in build_sections(views, ctx) for _, col in r.columns)}
    table = next(t for t in rows["allreduce"].blocks
                 if isinstance(t, Table) and t.title.startswith("all-reduce time at decode"))
    default = next(r for r in table.rows if r[0] == "default")
    got["report table"] = float(default[table.columns.index("bs1 (12 KiB) us")])
    headline = next(n.text for n in rows["summary"].blocks
                    if isinstance(n, Note) and n.text.startswith("Principal bottleneck"))
    got["report summary"] = re.search(r"decode sizes: ([\d.]+) us", headline).group(1)
    # the analytic comm model: the price of one decode all-reduce of GLM-5 at TP8, batch 1
    pricer = Pricer(b)
    got["comm model"] = pricer.allreduce_us(8, size)[0]
    pred = predict_step_comm(load_card("glm5-nvfp4"), Layout(tp=8), 1, pricer)
    got["comm model step"] = next(c["time_us_each"] for c in pred["collectives"]
                                  if c["op"] == ALL_REDUCE and c["size_bytes"] == size)
    # pcieprof compare's metric, in memory and as the command prints it
    got["compare metric"] = bundle_metrics(b, band)["allreduce.default.n8.time_us@12KiB"]
    r = cli("compare", str(path), str(path))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("allreduce.default.n8.time_us@12KiB "))
    got["compare stdout"] = line.split()[1]
    return got


def test_every_place_gives_the_same_decode_allreduce(demo_copies: dict[str, Path],
                                                     tmp_path: Path) -> None:
    values = {}
    for profile, path in demo_copies.items():
        want = Curves(Bundle.open(path).read_table("allreduce")).default().at(12 * 1024)
        got = _answers(path, tmp_path)
        shown = {"console": f"{want:.1f}", "recommend stdout": f"{want:.1f}",
                 "recommendations.json": f"{want:.1f}", "report table": round(want, 2),
                 "report summary": f"{want:.1f}", "comm model": want, "comm model step": want,
                 "compare metric": want, "compare stdout": f"{want:.4g}"}
        assert got == shown, f"{profile}: {got} != {shown}"
        values[profile] = want
    # the two boxes answer differently (a check that the places were really asked), and the VM's
    # answer is the README's 62.9 us
    assert f"{values['rtxpro6000-8x-vm']:.1f}" == "62.9"
    assert abs(values["rtxpro6000-8x-switch"] - values["rtxpro6000-8x-vm"]) > 1.0


def test_the_decode_comm_share_has_one_source(serve_bundle: Path, tmp_path: Path) -> None:
    """"What share of a decode step is communication" (a real reference-server trace, gloo):
    the report's headline, comm_model.json's traced comm per batch and attribution.json give
    pcieprof.analysis.decode_share's answer, and the report computes none of it."""
    b = Bundle.open(serve_bundle)
    doc = b.read_doc(Attribution)
    assert doc is not None and doc.decode_share is None  # recorded before the share was saved
    # as `attribute` and serve-bench save it now
    doc.decode_share, doc.decode_share_by_batch = decode_shares(doc.steps)
    b.write_doc(doc)
    every, at8 = decode_share(doc.steps), decode_share(doc.steps, 8)
    assert every is not None and at8 is not None and 0 < every.comm_pct < 100
    assert [s.batch for s in doc.decode_share_by_batch] == [8]  # the trace's DECODE steps
    views = open_views([serve_bundle])
    rows = {s.id: s for s in (col for r in build_sections(views, ReportContext()) for _, col in r.columns)}
    headline = next(n.text for n in rows["summary"].blocks
                    if isinstance(n, Note) and n.text.startswith("Decode steps (trace"))
    assert f"communication {every.comm_pct:.0f}% of the step" in headline
    assert f"{every.steps} steps over {every.ranks} rank(s)" in headline
    topo = tmp_path / "cpu_2rank_topology"
    shutil.copytree(REPORT_DATA / "cpu_2rank_topology", topo)
    out = tmp_path / "priced"
    r = cli("attribute", "--model", "tiny-cpu", "--topology", str(topo), "--serve",
            str(serve_bundle), "--tp", "2", "--batches", "8", "-o", str(out), "-q")
    assert r.returncode == 0, r.stderr
    row = json.loads((out / "comm_model.json").read_text())["table"][0]
    assert row["trace_comm_ms"] == pytest.approx(at8.comm_us / 1e3)
    assert row["exposed_comm_ms"] == pytest.approx(at8.exposed_comm_us / 1e3)
    # the report draws: no module of it prices, attributes or averages steps itself
    for path in (ROOT / "pcieprof" / "report").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for name in ("comparison_table", "predict_step_comm", "decode_share(", "Pricer("):
            assert name not in text, f"{path.name} computes {name}"
