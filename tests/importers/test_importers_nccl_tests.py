"""nccl-tests output: device lines (old and new), every row out-of-place and in-place."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.importers.nccl_tests import parse_nccl_tests

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"


def test_tinybox_old_device_lines(samples: Path) -> None:
    p = samples / "tool-outputs/all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt"
    parsed = parse_nccl_tests(p.read_text(), p.name)
    out, inp = parsed.collectives
    assert (out.variant, out.nranks, out.size_bytes, out.dtype) == (
        "imported:out_of_place", 6, 33554432, "fp32")
    assert (out.time_us, out.algbw_gbps, out.busbw_gbps, out.wrong) == (2275.1, 14.75, 24.58, 0)
    assert (inp.variant, inp.time_us, inp.algbw_gbps, inp.busbw_gbps) == (
        "imported:in_place", 2282.5, 14.70, 24.50)
    assert out.iters == 20 and out.collective == "all_reduce"
    assert parsed.facts["runs"][0]["avg_busbw_gbps"] == 24.5413
    assert [g.bus_id for g in parsed.gpus] == ["0000:01:00.0", "0000:42:00.0", "0000:81:00.0",
                                               "0000:82:00.0", "0000:c1:00.0", "0000:c2:00.0"]


def test_new_layout_two_nodes() -> None:
    p = DATA / "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt"
    parsed = parse_nccl_tests(p.read_text(), p.name)
    assert len(parsed.collectives) == 48
    rows = {(c.size_bytes, c.variant): c for c in parsed.collectives}
    r = rows[(4194304, "imported:in_place")]
    assert (r.time_us, r.algbw_gbps, r.busbw_gbps, r.nranks) == (1638.94, 2.56, 4.80, 16)
    r = rows[(268435456, "imported:out_of_place")]
    assert (r.time_us, r.algbw_gbps, r.busbw_gbps) == (13016.7, 20.62, 38.67)
    r = rows[(8589934592, "imported:in_place")]
    assert (r.time_us, r.busbw_gbps) == (459602.0, 35.04)
    assert parsed.facts["nccl_tests_version"] == "2.18.3"
    assert parsed.facts["nccl_version"] == "2.30.3+cuda13.0"
    assert parsed.facts["runs"][0]["avg_busbw_gbps"] == 17.8413
    # the GPUs of one machine (the first host), with their full bus ids
    assert len(parsed.gpus) == 8 and parsed.gpus[7].bus_id == "0000:f9:00.0"


def test_old_error_column_excerpt() -> None:
    p = DATA / "all_reduce_perf_4xV100_old_error_column.txt"
    parsed = parse_nccl_tests(p.read_text(), p.name)
    assert len(parsed.collectives) == 8
    # the excerpt starts at '# Using devices' and ends after a complete row: kept, and said
    assert parsed.facts["warnings"] == [
        f"{p.name}: 4 complete rows kept; not in the file: the '# nThread ... iters: N' header "
        "(timed iterations unknown); the '# Avg bus bandwidth' trailer"]
    r = [c for c in parsed.collectives if c.size_bytes == 64 and c.variant == "imported:in_place"][0]
    assert (r.time_us, r.nranks, r.wrong, r.status) == (278.1, 4, None, "ok")
    assert "max error 3e-08" in r.detail
    assert parsed.collectives[0].collective == "all_reduce"  # inferred: sum, count*4 == size


def test_wrong_results_are_errors(samples: Path) -> None:
    text = (samples / "tool-outputs/all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt").read_text()
    bad = text.replace("24.58      0 ", "24.58      3 ")
    parsed = parse_nccl_tests(bad, "wrong.txt")
    assert [c.status for c in parsed.collectives] == ["error", "ok"]
    assert parsed.collectives[0].wrong == 3


def test_other_collective_named_in_variant() -> None:
    text = (DATA / "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt").read_text().replace(
        "Collective test starting: all_reduce_perf", "Collective test starting: reduce_scatter_perf")
    parsed = parse_nccl_tests(text, "rs.txt")
    assert {c.variant for c in parsed.collectives} == {"imported:reduce_scatter:out_of_place",
                                                       "imported:reduce_scatter:in_place"}


def test_two_runs_in_one_file(samples: Path) -> None:
    text = (samples / "tool-outputs/all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt").read_text()
    parsed = parse_nccl_tests(text + text, "twice.txt")
    assert sorted({c.variant for c in parsed.collectives}) == [
        "imported:in_place:run1", "imported:in_place:run2",
        "imported:out_of_place:run1", "imported:out_of_place:run2"]
    assert pytest.approx([r["avg_busbw_gbps"] for r in parsed.facts["runs"]]) == [24.5413] * 2


def test_mpirun_prefixes_and_nccl_info_lines(samples: Path) -> None:
    """mpirun --tag-output prefixes and NCCL_DEBUG=INFO lines mixed into the output."""
    from pcieprof.importers.formats import parse_text

    table = (samples / "tool-outputs/all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt").read_text()
    log = (samples / "tool-outputs/nccl_debug_info_4x5060ti_p2p_cumem.log").read_text()
    lines = table.splitlines()
    mixed = lines[:10] + log.splitlines()[:60] + lines[10:]
    tagged = "\n".join(f"[1,0]<stdout>:{l}" for l in mixed) + "\n"
    parsed = parse_text(tagged, "tagged.txt")
    assert parsed.format == "nccl-tests"
    assert [(c.variant, c.busbw_gbps) for c in parsed.collectives] == [
        ("imported:out_of_place", 24.58), ("imported:in_place", 24.50)]
    assert parsed.documents["nccl_choices"].nccl_version == "2.28.9+cuda13.0"
