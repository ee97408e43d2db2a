"""nvbandwidth: text matrices (N/A, Waived) and JSON output, testcase names kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.errors import BadInput
from pcieprof.importers.nvbandwidth import parse_nvbandwidth_json, parse_nvbandwidth_text

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"


def test_text_matrix_with_na_diagonal() -> None:
    p = DATA / "nvbandwidth_6xA6000_read_ce.txt"
    parsed = parse_nvbandwidth_text(p.read_text(), p.name)
    assert parsed.facts["testcases"] == {"device_to_device_memcpy_read_ce": "Passed"}
    assert parsed.facts["version"] == "v0.8" and parsed.facts["driver_version"] == "580.95.05"
    assert len(parsed.p2p) == 30  # 6 x 6 cells less the N/A diagonal (a GPU to itself)
    by = {(r.src, r.dst): r for r in parsed.p2p}
    assert by[(0, 3)].bandwidth_gbps == 21.95 and by[(0, 3)].path == "p2p"
    assert by[(5, 1)].bandwidth_gbps == 22.67
    assert all(r.src != r.dst for r in parsed.p2p) and {r.status for r in parsed.p2p} == {"ok"}
    assert all(r.detail.startswith("nvbandwidth device_to_device_memcpy_read_ce:") for r in parsed.p2p)
    # The SUM line is the sum of the cells (each printed rounded to 0.01: 30 cells, <= 0.15).
    total = sum(r.bandwidth_gbps for r in parsed.p2p if r.bandwidth_gbps is not None)
    assert total == pytest.approx(parsed.facts["sums"]["device_to_device_memcpy_read_ce"], abs=0.15)


def test_waived_test_case_is_a_status() -> None:
    p = DATA / "nvbandwidth_2x2080ti_waived.txt"
    parsed = parse_nvbandwidth_text(p.read_text(), p.name)
    assert parsed.facts["testcases"] == {"device_to_device_memcpy_write_ce": "Waived"}
    assert [(r.status, r.path) for r in parsed.p2p] == [("waived", "p2p")]
    assert [g.name for g in parsed.gpus] == ["NVIDIA GeForce RTX 2080 Ti"] * 2


def test_json_output() -> None:
    p = DATA / "nvbandwidth_1gpu_v0.5_dcgm_tests.json"
    parsed = parse_nvbandwidth_json(p.read_text(), p.name)
    cases = parsed.facts["testcases"]
    assert len(cases) == 32 and cases["host_to_device_memcpy_ce"] == "Passed"
    assert cases["device_to_device_memcpy_read_ce"] == "Waived"
    assert parsed.facts["driver_version"] == "565.02" and parsed.facts["version"] == "v0.5"
    h2d = [r for r in parsed.p2p if r.detail.startswith("nvbandwidth host_to_device_memcpy_ce:")]
    assert [(r.src, r.dst, r.path, r.direction, r.bandwidth_gbps) for r in h2d] == [
        (-1, 0, "h2d", "uni", 12.3964)]
    d2h_bi = [r for r in parsed.p2p
              if r.detail.startswith("nvbandwidth device_to_host_bidirectional_memcpy_ce:")]
    assert [(r.src, r.dst, r.path, r.direction, r.bandwidth_gbps) for r in d2h_bi] == [
        (0, -1, "d2h", "bi", 11.329)]
    lat = [r for r in parsed.p2p if "host_device_latency_sm" in r.detail]
    assert lat[0].latency_us == pytest.approx(0.649879) and lat[0].bandwidth_gbps is None
    waived = [r for r in parsed.p2p if r.status == "waived"]
    assert {r.detail.split(":")[0] for r in waived} >= {"nvbandwidth device_to_device_memcpy_read_ce"}
    # all_to_host / host_to_all run copies at once: concurrent rows, the SUM as the aggregate
    agg = [c for c in parsed.concurrent if c.pattern == "all_to_host_memcpy_ce" and c.flow == -1]
    assert agg[0].bandwidth_gbps == pytest.approx(13.199809800000001)
    assert {c.status for c in parsed.concurrent if c.pattern == "all_to_one_write_ce"} == {"waived"}


def test_json_with_warning_lines_around_it() -> None:
    body = (DATA / "nvbandwidth_1gpu_v0.5_dcgm_tests.json").read_text()
    parsed = parse_nvbandwidth_json("WARNING: Failed to acquire log file lock.\n" + body
                                    + "\nWARNING: suffix\n", "wrapped.json")
    assert parsed.facts["testcases"]["host_to_device_memcpy_sm"] == "Passed"


def test_truncated_json_names_file_and_line() -> None:
    body = (DATA / "nvbandwidth_1gpu_v0.5_dcgm_tests.json").read_text()
    cut = "\n".join(body.splitlines()[:40])
    with pytest.raises(BadInput) as e:
        parse_nvbandwidth_json(cut, "cut.json")
    msg = e.value.one_line()
    assert msg.startswith("cut.json:") and "valid JSON" in msg and "\n" not in msg


def test_text_full_run_host_rows() -> None:
    p = DATA / "nvbandwidth_8x4090_h2d_d2h.txt"
    parsed = parse_nvbandwidth_text(p.read_text(), p.name)
    assert parsed.facts["testcases"] == {"host_to_device_memcpy_ce": "Passed",
                                         "device_to_host_memcpy_ce": "Passed"}
    assert len(parsed.gpus) == 8 and parsed.gpus[7].bus_id is None
    h2d = {r.dst: r.bandwidth_gbps for r in parsed.p2p if r.path == "h2d"}
    d2h = {r.src: r.bandwidth_gbps for r in parsed.p2p if r.path == "d2h"}
    assert h2d[2] == 23.90 and d2h[4] == 27.10 and len(h2d) == len(d2h) == 8
    assert all(r.dst == -1 for r in parsed.p2p if r.path == "d2h")
    assert sum(h2d.values()) == pytest.approx(parsed.facts["sums"]["host_to_device_memcpy_ce"], abs=0.04)
    assert sum(d2h.values()) == pytest.approx(parsed.facts["sums"]["device_to_host_memcpy_ce"], abs=0.04)


def test_bidirectional_read1_read2_total() -> None:
    """The per-direction matrices go to facts; `Total` gives the bi rows. The two matrices are
    the 6x A6000 sample's under the headings nvbandwidth prints for a bidirectional case."""
    lines = (DATA / "nvbandwidth_6xA6000_read_ce.txt").read_text().splitlines()
    matrix = lines[10:17]
    text = "\n".join(["Running device_to_device_bidirectional_memcpy_read_ce.",
                      "memcpy CE GPU(row) <-> GPU(column) Read1 bandwidth (GB/s)", *matrix, "",
                      "SUM device_to_device_bidirectional_memcpy_read_ce_read1 715.53", "",
                      "memcpy CE GPU(row) <-> GPU(column) Total bandwidth (GB/s)", *matrix, "",
                      "SUM device_to_device_bidirectional_memcpy_read_ce_total 715.53", ""])
    parsed = parse_nvbandwidth_text(text, "bidir.txt")
    assert len(parsed.p2p) == 30 and all(r.direction == "bi" for r in parsed.p2p)
    assert all("Total" in r.detail for r in parsed.p2p)
    read1 = parsed.facts["directional"]["device_to_device_bidirectional_memcpy_read_ce:Read1"]
    assert read1[0][3] == "21.95"
