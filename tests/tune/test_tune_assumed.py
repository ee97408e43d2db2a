"""A simulated gain at both ends of each assumed number it rests on (issue 22 point 7): the
simulator stores every variant's decode all-reduces at the low and high end of each assumed
parameter of the fabric model (topology.json sim.assumed), and a recommendation whose gain moves
with one says so with both gains."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from builders.cli import cli

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.cards import load_card
from pcieprof.commands.tuning import tune
from pcieprof.sim.assumed import ASSUMED

GLM5 = load_card("glm5-nvfp4")
BAND = DecodeBand.of_card(GLM5)


def _ends(line: str) -> tuple[float, float]:
    """The two gains (ms) of a `... gain +1.90 ms at 0, +3.53 ms at 1` line."""
    tail = line.split("mean decode-step gain ", 1)[1]
    lo, hi = (part.split(" ms at ")[0] for part in tail.split(", "))
    return float(lo), float(hi)


def test_the_vm_p2p_gain_at_both_ends_of_the_iommu_latency(sim_vm_variants_bundle: Path,
                                                             tmp_path: Path) -> None:
    b = tmp_path / "vm"
    shutil.copytree(sim_vm_variants_bundle, b)
    stored = json.loads((b / "topology.json").read_text())["sim"]["assumed"]
    assert [e["param"] for e in stored] == [f"{s}.{k}" for s, k, *_ in ASSUMED]
    doc = tune(Bundle.open(b), GLM5, BAND, write_files=False)
    rec = next(r for r in doc.recommendations if r.rule == "p2p_level")
    line = next(c for c in rec.caveats if "rests on latency.iommu_us = 0.3" in c)
    lo, hi = _ends(line)
    # translation is paid per access: the default's host-memory steps pay it twice, P2P once,
    # so allowing P2P gains more the dearer a translated access is
    assert 0 < lo < hi
    assert "at 0, " in line and line.endswith(" at 1")


def test_the_ll_gain_rests_on_the_assumed_ll_channel_bandwidth(demo_bundles: dict[str, Path],
                                                              tmp_path: Path) -> None:
    b = tmp_path / "bare"
    shutil.copytree(demo_bundles["rtxpro6000-8x-switch"], b)
    doc = tune(Bundle.open(b), GLM5, BAND, write_files=False)
    rec = next(r for r in doc.recommendations if r.rule == "proto_ll")
    line = next(c for c in rec.caveats if "rests on nccl.ll_channel_gbps = 8" in c)
    lo, hi = _ends(line)
    assert 0 < lo < hi  # a faster LL channel, a larger gain
    # parameters that do not move it are not named
    assert not any("rests on nccl.tree_bw_factor" in c for c in rec.caveats)


def test_recommend_prints_the_range_under_the_card(sim_vm_variants_bundle: Path,
                                                   tmp_path: Path) -> None:
    r = cli("recommend", str(sim_vm_variants_bundle), "--out", str(tmp_path / "vm"), "-q")
    assert r.returncode == 0, r.stderr
    assert "   range: latency.iommu_us = 0.3 (assumed, range 0 (translation costs" in r.stdout



def test_the_top_layout_at_both_ends_of_the_assumed_all_gather_cost(
        demo_bundles: dict[str, Path], tmp_path: Path) -> None:
    """The layouts price every all-gather (the lm_head logits each step) at 0.5 x an all-reduce
    of its size, an assumed factor: the top layout's `why` (printed by recommend, kept in
    recommendations.json) gives its step and peak at the factor's high end."""
    for name, src in sorted(demo_bundles.items()):
        b = tmp_path / name
        shutil.copytree(src, b)
        doc = tune(Bundle.open(b), GLM5, BAND, write_files=False)
        why = doc.layouts[0].why
        said = why.split("range of the assumed all-gather cost (0.5 x an all-reduce of its size; "
                         "range 0.5-1, itself assumed): at 1, ", 1)[1]
        # each value only where it moves at the precision shown: never "22.2 (not 22.2)"
        for step, was in re.findall(r"([\d.]+) ms per step at c=1 \(not ([\d.]+)\)", said):
            assert float(step) > float(was)  # a dearer all-gather, a slower step
        peaks = re.findall(r"([\d.]+) tok/s at c=\d+ \(not ([\d.]+)\)", said)
        assert peaks, said
        for peak, peak_was in peaks:
            assert float(peak) < float(peak_was)
