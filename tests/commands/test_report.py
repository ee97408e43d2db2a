from __future__ import annotations

import json
import shutil
from pathlib import Path

from builders.bundles import REPORT_DATA
from builders.cli import cli

from pcieprof.analysis.decode_band import band_for
from pcieprof.analysis.metrics import bundle_metrics, higher_is_better
from pcieprof.report import write_report


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
    from pcieprof.bundle import Bundle

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
