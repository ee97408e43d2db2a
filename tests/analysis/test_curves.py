"""The one rule for reading an all-reduce time off a curve, the default curve, the decode band."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.analysis.curves import EXTRAPOLATED, FLOOR, INTERPOLATED, MEASURED, UNKNOWN, Curves
from pcieprof.analysis.decode_band import QUOTED_BATCHES, DecodeBand, band_for
from pcieprof.bundle import Bundle
from pcieprof.cards import DEFAULT_CARD, load_card
from pcieprof.errors import BadInput

KiB = 1024
# WRX90 8-GPU ring, NCCL_P2P_LEVEL=SYS (../shared/calibration/README.md): size -> time_us
AR8 = {4 * KiB: 23.93, 16 * KiB: 18.66, 64 * KiB: 18.13, 256 * KiB: 25.09, 1 << 20: 81.08}


def _bundle(tmp_path: Path) -> Bundle:
    b = Bundle.create(tmp_path / "b", command="import", source="imported", backend="imported")
    rows = []
    for variant, env, ranks, scale in (("default", {}, (0, 1, 2, 3, 4, 5, 6, 7), 1.0),
                                       ("default", {}, (0, 2, 1, 3, 4, 6, 5, 7), 0.9),
                                       ("proto_ll", {"NCCL_PROTO": "LL"}, tuple(range(8)), 0.8),
                                       ("default", {}, (0, 1, 2, 3), 0.7)):
        for size, t in AR8.items():
            for dtype, f in (("bf16", 1.0), ("fp32", 2.0)):
                rows.append({"backend": "imported", "variant": variant, "env": env,
                             "nranks": len(ranks), "ranks": ranks, "size_bytes": size,
                             "dtype": dtype, "time_us": t * scale * f, "status": "ok"})
    rows.append({"backend": "imported", "variant": "default", "env": {}, "nranks": 8,
                 "ranks": tuple(range(8)), "size_bytes": 8, "dtype": "bf16", "status": "hang"})
    b.append_rows("allreduce", rows)
    return b


def test_one_rule_inside_below_and_above(tmp_path: Path) -> None:
    c = Curves(_bundle(tmp_path).read_table("allreduce")).default()
    assert c.ranks == tuple(range(8)) and c.dtype == "bf16" and c.variant == "default"
    assert (c.extent(16 * KiB), c.at(16 * KiB)) == (MEASURED, pytest.approx(18.66))
    # between two sizes: log-log, the geometric mean at the geometric middle
    assert c.extent(512 * KiB) == INTERPOLATED
    assert c.at(512 * KiB) == pytest.approx(math.sqrt(25.09 * 81.08))
    # below the smallest size, which is latency-bound: the floor
    assert (c.extent(8), c.at(8)) == (FLOOR, pytest.approx(23.93)) and c.covers(8)
    # above the largest: linear in size, and not `covered`
    assert c.extent(4 << 20) == EXTRAPOLATED and not c.covers(4 << 20)
    assert c.at(4 << 20) == pytest.approx(81.08 * 4)


def test_a_bandwidth_only_curve_says_nothing_about_latency(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="import", source="imported", backend="imported")
    b.append_rows("allreduce", [{"variant": "imported:out_of_place", "nranks": 6,
                                 "ranks": tuple(range(6)), "size_bytes": s, "dtype": "fp32",
                                 "time_us": t, "status": "ok"}
                                for s, t in ((32 << 20, 2000.0), (64 << 20, 3900.0))])
    c = Curves(b.read_table("allreduce")).default()
    assert c is not None and c.variant == "imported:out_of_place"  # no `default`: env {} it is
    assert c.extent(12 * KiB) == UNKNOWN and math.isnan(c.at(12 * KiB))


def test_lookups(tmp_path: Path) -> None:
    cs = Curves(_bundle(tmp_path).read_table("allreduce"))
    assert cs.max_nranks == 8 and cs.backend == "imported"
    assert {c.ranks for c in cs.full_group() if c.variant == "default"} == {
        tuple(range(8)), (0, 2, 1, 3, 4, 6, 5, 7)}
    assert cs.find({"NCCL_PROTO": "LL"}).variant == "proto_ll"
    assert cs.find(ranks=(0, 2, 1, 3, 4, 6, 5, 7)).at(16 * KiB) == pytest.approx(0.9 * 18.66)
    assert cs.default(nranks=4).ranks == (0, 1, 2, 3)
    assert cs.nearest_group(6) == 8 and cs.nearest_group(3) == 4


def test_decode_band_from_the_card() -> None:
    glm = band_for()
    assert glm.model == DEFAULT_CARD and glm.lo_bytes == 12 * KiB and glm.hi_bytes == 768 * KiB
    assert glm.batches == QUOTED_BATCHES
    tiny = DecodeBand.of_card(load_card("tiny-cpu"))
    assert tiny.bytes_per_elem == 4  # the reference server computes in fp32
    assert DecodeBand.of_card(load_card("glm5-nvfp4"), 2, 16).batches == (2, 8)
    with pytest.raises(BadInput, match="unknown model card 'glm-9'"):
        band_for("glm-9")


@pytest.mark.parametrize("command", ["report", "recommend", "compare"])
def test_an_unknown_model_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    args = [str(b.path)] * (2 if command == "compare" else 1)
    r = cli(command, *args, "--model", "glm-9")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "unknown model card 'glm-9'" in r.stderr
    assert not (b.path / "report.html").exists() and not (b.path / "recommendations.json").exists()
