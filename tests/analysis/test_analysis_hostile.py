"""Hostile traces: an event with a negative duration is not a time span. Before, one such kernel
made its `top_kernels.csv` total negative (-990 us for a 10 us and a -1000 us kernel); now it is
dropped, counted per rank (`n_dropped_bad_duration`) and named in one warning line."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from builders.cli import cli
from pcieprof.analysis.attribution import attribute_traces

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _kernel(ts: float, dur: float, name: str, corr: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"stream": 7, "correlation": corr, "device": 0,
                     **({"Collective name": "allreduce", "In msg nelems": 6144,
                         "dtype": "BFloat16", "Group size": 2} if name == NCCL else {})}}


def _trace(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    return path


@pytest.mark.timeout(60)
def test_negative_durations_are_dropped_and_counted(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "rank0.json", [
        _kernel(0, 10, "gemm_kernel", 1), _kernel(20, -1000, "gemm_kernel", 2),
        _kernel(30, -5, NCCL, 3), _kernel(40, 5, NCCL, 4)])
    out = tmp_path / "attr"
    r = cli("attribute", str(trace), "-q", "-o", str(out))
    assert r.returncode == 0, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert err == [f"warning: {trace}: 2 event(s) with a negative or non-finite duration "
                   "dropped (not counted)"]
    with (out / "attribution" / "top_kernels.csv").open() as f:
        top = {r["name"]: r for r in csv.DictReader(f)}
    assert (top["gemm_kernel"]["count"], float(top["gemm_kernel"]["total_us"])) == ("1", 10.0)
    assert (top[NCCL]["count"], float(top[NCCL]["total_us"])) == ("1", 5.0)
    doc = json.loads((out / "attribution.json").read_text())
    rank = doc["ranks"][0]
    assert rank["n_dropped_bad_duration"] == 2 and rank["n_gpu_events"] == 2
    assert rank["totals"]["comm_us"] == 5.0 and rank["totals"]["compute_us"] == 10.0
    assert min(v for v in rank["totals"].values() if isinstance(v, (int, float))) >= 0


@pytest.mark.timeout(60)
def test_a_trace_of_only_negative_durations_counts_nothing(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "rank0.json", [_kernel(0, -3, "gemm_kernel", 1),
                                             _kernel(5, -4, NCCL, 2)])
    doc = attribute_traces([trace], workers=1)
    rank = doc.ranks[0]
    assert rank.n_dropped_bad_duration == 2 and rank.n_gpu_events == 0
    assert doc.top_kernels == []
