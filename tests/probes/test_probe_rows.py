"""Row maths of the probes (medians, nccl-tests formulas, aggregates) and the data check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from probes.allreduce_worker import allreduce_row
from probes.p2p_worker import concurrent_rows, p2p_row
from probes.pattern import matches, pattern
from pcieprof.bundle.plan import AllReduceCase, ConcurrentCase, P2PCase
from probes.rows import RowWriter


def test_bandwidth_row_is_the_median_of_trials_with_the_spread() -> None:
    case = P2PCase(0, 1, "p2p", "bi", "bandwidth", 1_000_000, 4, 3)
    row = p2p_row(case, "cpu", [0.004, 0.002, 0.008])
    # bi moves 2 x 4 x 1e6 bytes per trial: 8e6 B / 0.004 s = 2 GB/s
    assert math.isclose(row["bandwidth_gbps"], 2.0)
    assert math.isclose(row["bandwidth_gbps_min"], 1.0) and math.isclose(row["bandwidth_gbps_max"], 4.0)
    assert math.isnan(row.get("latency_us", float("nan")))
    lat = p2p_row(P2PCase(-1, 2, "h2d", "uni", "latency", 8, 100, 3), "cuda", [1e-4, 3e-4, 2e-4])
    assert (lat["src"], lat["dst"]) == (-1, 2)
    assert math.isclose(lat["latency_us"], 2.0) and math.isclose(lat["latency_us_max"], 3.0)
    err = p2p_row(case, "cpu", None, status="error", detail="wrong bytes")
    assert err["status"] == "error" and "bandwidth_gbps" not in err


def test_allreduce_row_uses_nccl_tests_formulas() -> None:
    case = AllReduceCase("proto_ll", {"NCCL_PROTO": "LL"}, [3, 1, 0, 2], [1 << 20], ["bf16"], 1, 5)
    row = allreduce_row(case, "cuda", 1 << 20, "bf16", [1e-4, 2e-4, 1.5e-4], True)
    algbw = (1 << 20) / 1.5e-4 / 1e9
    assert math.isclose(row.algbw_gbps, algbw)
    assert math.isclose(row.busbw_gbps, algbw * 2 * 3 / 4)
    assert math.isclose(row.time_us, 150.0)
    assert row.ranks == (3, 1, 0, 2) and row.nranks == 4
    assert row.env == {"NCCL_PROTO": "LL"}
    assert allreduce_row(case, "cuda", 8, "fp32", [1e-5], False).status == "error"


def test_concurrent_aggregate_spans_all_flows() -> None:
    case = ConcurrentCase("shared_uplink", "write", [(0, 2), (1, 3)], 1_000_000, 2)
    rows = concurrent_rows(case, "cpu", [(0.0, 0.001), (0.0005, 0.002)], [True, True])
    assert [r["flow"] for r in rows] == [0, 1, -1]
    assert math.isclose(rows[0]["bandwidth_gbps"], 2.0)  # 2e6 B in 1 ms
    assert math.isclose(rows[-1]["bandwidth_gbps"], 2.0)  # 4e6 B in 2 ms
    # flow 1 started 0.5 ms after flow 0: its start skew, and the aggregate's (the largest)
    assert [r["start_skew_us"] for r in rows] == pytest.approx([0.0, 500.0, 500.0])
    assert all("release" not in r and "held" not in r for r in rows)  # no round: not recorded
    bad = concurrent_rows(case, "cpu", [(0.0, 0.001), (0.0, 0.001)], [True, False])
    assert bad[1]["status"] == "error" and bad[-1]["status"] == "error"
    hang = concurrent_rows(case, "cpu", None, None, "killed", status="hang")
    assert {r["status"] for r in hang} == {"hang"} and len(hang) == 3


def test_pattern_check_catches_one_wrong_byte() -> None:
    got = pattern(4096, 7).clone()
    assert matches(got, 4096, 7)
    assert not matches(got, 4096, 8)  # stale data from another case
    got[1234] ^= 1
    assert not matches(got, 4096, 7)
    assert not matches(torch.roll(pattern(4096, 7), 4), 4096, 7)  # shifted by one word


def test_row_writer_lines_are_complete_json(tmp_path: Path) -> None:
    w = RowWriter(tmp_path, 3)
    w.event("start", case=1)
    w.row("p2p", {"src": 0, "bandwidth_gbps": float("nan")})
    w.close()
    lines = [json.loads(x) for x in (tmp_path / "rank3.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["rank"] == 3
    assert lines[1] == {"table": "p2p", "row": {"src": 0, "bandwidth_gbps": None}}
