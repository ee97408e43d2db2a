"""Memory in recommendations.json is GiB, as everywhere else users see it (issue 22 point 2,
"units are stated once"): the layouts' `*_gib` fields, `recommend`'s console and the report's
layout table show the same numbers, and a file written before (`*_gb`, 1e9 bytes) still reads,
converted."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.analysis.box import GIB
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations

OLD = {"weights_gb": "weights_gib", "kv_gb_per_request": "kv_gib_per_request",
       "gpu_memory_gb": "gpu_memory_gib"}


def _report_rows(bundle: Path, page: Path) -> dict[str, tuple[str, str]]:
    """The report's layout table: label -> (weights GiB/GPU, KV GiB/request) as printed."""
    r = cli("report", str(bundle), "-o", str(page), "-q")
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    rows = {}
    for m in re.finditer(r"<tr><td>([^<]+)</td><td>(?:yes|no)</td><td>([\d.]+)</td>"
                         r"<td>([\d.]+)</td>", text):
        rows[m[1]] = (m[2], m[3])
    return rows


def test_layout_memory_is_gib_in_file_console_and_report(sim_vm_bundle: Path,
                                                           tmp_path: Path) -> None:
    b = tmp_path / "vm"
    shutil.copytree(sim_vm_bundle, b)
    r = cli("recommend", str(b))
    assert r.returncode == 0, r.stderr
    raw = json.loads((b / "recommendations.json").read_text())
    assert raw["format"] == "pcieprof.recommendations/2"
    for lay in raw["layouts"]:
        assert not set(OLD) & set(lay), "a field in 1e9 bytes is still written"
        assert set(OLD.values()) <= set(lay)
    doc = Bundle.open(b).read_doc(Recommendations)
    assert doc is not None
    tp8 = next(lay for lay in doc.layouts if lay.label == "TP8")
    # GLM-5 NVFP4 at TP8: ~55 GiB of weights per GPU (the card's published "~57 GB" are GiB,
    # with the MTP layer), an RTX PRO 6000 holds 95.6 GiB (97887 MiB)
    assert 52 < tp8.weights_gib < 57
    assert 90 < tp8.gpu_memory_gib < 97
    for lay in doc.layouts:
        assert f"  {lay.label:<24} weights {lay.weights_gib:.1f} GiB/GPU, " in r.stdout
    rows = _report_rows(b, tmp_path / "new.html")
    assert rows, "no layout row found in the report"
    for lay in doc.layouts:
        assert rows[lay.label] == (f"{lay.weights_gib:.1f}", f"{lay.kv_gib_per_request:.2f}")

    # a file written before the rename: the same layouts in 1e9 bytes under the old names
    for lay in raw["layouts"]:
        for old, new in OLD.items():
            lay[old] = lay.pop(new) * GIB / 1e9
    raw["format"] = "pcieprof.recommendations/1"
    (b / "recommendations.json").write_text(json.dumps(raw))
    again = Bundle.open(b).read_doc(Recommendations)
    assert again is not None
    for a, n in zip(again.layouts, doc.layouts):
        for new in OLD.values():
            assert getattr(a, new) == pytest.approx(getattr(n, new), rel=1e-9)
    assert _report_rows(b, tmp_path / "old.html") == rows
