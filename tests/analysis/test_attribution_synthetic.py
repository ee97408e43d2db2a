"""Small traces from benchmarks/make_synthetic_trace.py (synthetic by construction): CUDA-graph
steps found from cudaGraphLaunch gaps, per-step sums adding up to the rank, and the cross-rank
split. The big-file memory check is a benchmark, not a test (see the benchmark's docstring)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from pcieprof.analysis.attribution import attribute_traces

ROOT = Path(__file__).resolve().parents[2]


def _gen():
    spec = importlib.util.spec_from_file_location("mst", ROOT / "benchmarks" / "make_synthetic_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _union(iv: list[tuple[float, float]]) -> float:
    total, cur = 0.0, None
    for s, e in sorted(iv):
        if cur is None or s > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0.0)


@pytest.mark.parametrize("graphs", [False, True])
def test_synthetic_steps_and_totals(tmp_path: Path, graphs: bool) -> None:
    info = _gen().main(["--out", str(tmp_path), "--ranks", "2", "--target-mb", "1.5",
                        "--layers", "6", "--gzip", *(["--graphs"] if graphs else [])])
    files = [Path(i["path"]) for i in info]
    doc = attribute_traces(files).to_json()  # the shape attribution.json holds
    for r in doc["ranks"]:
        assert r["steps_from"] == ("cudaGraphLaunch gaps" if graphs else "ProfilerStep spans")
        assert r["n_steps"] == info[r["rank"]]["steps"]
        steps = [s for s in doc["steps"] if s["rank"] == r["rank"]]
        # every GPU event belongs to exactly one step: per-step comm adds up to the rank's
        assert sum(s["comm_us"] for s in steps) == pytest.approx(r["totals"]["comm_us"], rel=1e-9)
        assert sum(s["n_events"] for s in steps) == r["n_gpu_events"]
        # independent union of the nccl kernels, from plain json
        import gzip
        ev = json.load(gzip.open(files[r["rank"]], "rt"))["traceEvents"]
        comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
        comp = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "kernel" and not e["name"].startswith("nccl")]
        assert r["totals"]["comm_us"] == pytest.approx(_union(comm), rel=0.01)
        assert r["totals"]["compute_us"] == pytest.approx(_union(comp), rel=0.01)
        assert 0 < r["totals"]["comm_overlap_pct"] < 20  # the generator overlaps a little
    xr = doc["cross_rank"]
    assert xr["status"] == "ok" and xr["n_collectives"] == info[0]["comm_kernels"]
    waits = [p["wait_us"] for p in xr["per_rank"]]
    assert all(w >= 0 for w in waits) and sum(waits) > 0
    # per collective, the transfer never exceeds either rank's duration
    assert all(p["transfer_us"] <= p["matched_comm_us"] for p in xr["per_rank"])
    assert np.isclose(xr["per_rank"][0]["transfer_us"], xr["per_rank"][1]["transfer_us"])
