"""The vectorised block scan (trace_scan) reads exactly what the general reader reads: column for
column, bit for bit, on the real traces in ../shared/samples/traces, on the same events written in
the other layouts JSON writers use, and across many block cuts; blocks it cannot read (another key
order, an escaped backslash before a quote) go to the general reader with the same result.
Numbers are compared with float() of their text."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pcieprof.analysis import trace_stream
from pcieprof.analysis.classify import Classifier
from pcieprof.analysis.trace_scan import PAD, scan

NCCL_DATA = "traces/hta_nccl_single_rank/nccl_data.json.gz"
REAL = [NCCL_DATA, "traces/hta_trace_filter_2rank/sampled_rank-0.json.gz",
        "traces/tracelens_b200_vllm_tp8/tracelens_b200_vllm_tp8_gptoss_eager_rank0.json.gz"]


def _read(monkeypatch: pytest.MonkeyPatch, path: Path, reader: str, block: int = 1 << 20,
          ) -> tuple[trace_stream.RankTrace, list[bool]]:
    """read_trace with `reader` and blocks of `block` bytes; also whether each block was scanned."""
    scanned: list[bool] = []

    def counting(run: bytes) -> Any:
        sc = scan(run)
        scanned.append(sc is not None)
        return sc

    with monkeypatch.context() as m:
        m.setattr(trace_stream, "READER", reader)
        m.setattr(trace_stream, "_BLOCK", block)
        m.setattr(trace_stream, "scan", counting)
        return trace_stream.read_trace(path, Classifier()), scanned


def _columns(rt: trace_stream.RankTrace) -> dict[str, Any]:
    """Everything attribution reads from a RankTrace, with ids replaced by what they name."""
    comm = {int(e): rt.comm_arg_table[a] for e, a in zip(rt.comm_event, rt.comm_arg)}
    return {
        "rank": rt.rank, "info": rt.distributed_info, "n_events": rt.n_events,
        "g_name": [rt.names[i] for i in rt.g_name], "g_ts": rt.g_ts.tolist(),
        "g_dur": rt.g_dur.tolist(), "g_stream": rt.g_stream.tolist(), "g_corr": rt.g_corr.tolist(),
        "g_bit": rt.g_bit.tolist(), "g_family": [rt.families[i] for i in rt.g_family],
        "comm": comm, "l_corr": rt.l_corr.tolist(), "l_ts": rt.l_ts.tolist(),
        "l_graph": rt.l_graph.tolist(), "c_ts": rt.c_ts.tolist(), "spans": rt.spans,
    }


def _rewrite(src: Path, dst: Path, edit: Any = None, **dumps: Any) -> Path:
    doc = json.loads(gzip.open(src).read())
    if edit:
        edit(doc["traceEvents"])
    dst.write_text(json.dumps(doc, **dumps), encoding="utf-8")
    return dst


@pytest.mark.parametrize("rel", REAL)
@pytest.mark.parametrize("block", [1 << 20, 48 << 10])
def test_scan_reads_what_the_general_reader_reads(samples: Path, monkeypatch: pytest.MonkeyPatch,
                                                  rel: str, block: int) -> None:
    fast, scanned = _read(monkeypatch, samples / rel, "scan", block)
    slow, _ = _read(monkeypatch, samples / rel, "chunked", block)
    assert scanned and all(scanned)  # every block was read by the scan, none fell back
    a, b = _columns(fast), _columns(slow)
    assert a == b
    assert len(a["g_ts"]) > 900 and len(a["l_ts"]) > 900


@pytest.mark.parametrize("layout", [
    {"indent": 4},  # pretty-printed, as the vLLM sample (one key per line, lists over lines)
    {"separators": (",", ":")},  # compact
    {},  # json.dumps defaults (", ", ": ") on one line
])
def test_other_writers_layouts(samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               layout: dict[str, Any]) -> None:
    path = _rewrite(samples / NCCL_DATA, tmp_path / "t.json", **layout)
    fast, scanned = _read(monkeypatch, path, "scan", 64 << 10)
    slow, _ = _read(monkeypatch, path, "chunked", 64 << 10)
    assert all(scanned)
    assert _columns(fast) == _columns(slow)
    orig, _ = _read(monkeypatch, samples / NCCL_DATA, "chunked")
    assert _columns(fast) == _columns(orig)  # the layout changes nothing read


def test_blocks_it_cannot_read_fall_back(samples: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def reorder(events: list[dict[str, Any]]) -> None:  # "ph" first, then alphabetical
        for i, e in enumerate(events):
            events[i] = {"ph": e.get("ph"), **{k: e[k] for k in sorted(e) if k != "ph"}}

    path = _rewrite(samples / NCCL_DATA, tmp_path / "sorted.json", reorder)
    fast, scanned = _read(monkeypatch, path, "scan", 256 << 10)
    assert scanned and not any(scanned)
    orig, _ = _read(monkeypatch, samples / NCCL_DATA, "chunked")
    assert _columns(fast) == _columns(orig)


@pytest.mark.parametrize("suffix, scanned_all", [(' "quoted" name', True), (" ends in \\", False)])
def test_escapes_in_names(samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          suffix: str, scanned_all: bool) -> None:
    def edit(events: list[dict[str, Any]]) -> None:
        for e in events:
            if e.get("cat") == "kernel" and "elementwise" in e.get("name", ""):
                e["name"] += suffix

    path = _rewrite(samples / NCCL_DATA, tmp_path / "esc.json", edit)
    fast, scanned = _read(monkeypatch, path, "scan", 128 << 10)
    slow, _ = _read(monkeypatch, path, "chunked", 128 << 10)
    assert all(scanned) == scanned_all  # an escaped backslash before a quote: general reader
    a = _columns(fast)
    assert a == _columns(slow)
    assert any(n.endswith(suffix) for n in a["g_name"])


def _kernel_block(ts: list[str], dur: list[str]) -> bytes:
    rows = []
    for i, (t, d) in enumerate(zip(ts, dur)):
        rows.append('{\n    "ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "tid": 7,\n'
                    '    "ts": %s, "dur": %s,\n    "args": {\n      "External id": %d,'
                    '      "stream": 7, "correlation": %d\n    }\n  }' % (i % 3, t, d, i, 1000 + i))
    return ",\n  ".join(rows).encode()


def test_numbers_are_read_as_float_reads_them() -> None:
    rng = random.Random(7)
    ts, dur = [], []
    for _ in range(4000):
        x = rng.uniform(0, 1e13)
        ts.append(rng.choice([f"{x:.3f}", repr(x), str(int(x)), f"{x + 1.7e15:.3f}",
                              repr(x * 1e-20), f"{x:.0f}.5", "0", f"-{x:.2f}"]))
        y = rng.expovariate(1 / 50)
        dur.append(rng.choice([f"{y:.3f}", repr(y), repr(y * 1e-9), str(int(y)), "0.0",
                               f"{y:.17f}", f"{y:.1f}"]))
    sc = scan(_kernel_block(ts, dur) + PAD)
    assert sc is not None
    assert sc.g_ts.tolist() == [float(t) for t in ts]
    assert sc.g_dur.tolist() == [float(d) for d in dur]
    assert sc.g_corr.tolist() == list(range(1000, 1000 + len(ts)))
    assert (sc.g_stream == 7).all() and sc.n_x == len(ts)


def test_only_the_selected_events_are_decoded() -> None:
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2,
           "args": {"External id": 3, "correlation": 99}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1,
           "ts": 2.0, "dur": 1, "args": {"correlation": 5}},
          {"ph": "f", "id": 5, "pid": 1, "tid": 1, "ts": 2.5, "cat": "ac2g", "name": "ac2g"},
          {"ph": "X", "cat": "python_function", "name": "w.py(3): execute_model", "pid": 1,
           "tid": 1, "ts": 1.0, "dur": 9.0, "args": {}},
          {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 9, "ts": 3.0,
           "dur": 0.5, "args": {"device": 0, "correlation": 5}}]
    sc = scan(json.dumps(ev)[1:-1].encode() + PAD)
    assert sc is not None and sc.n_x == 4
    assert sc.g_name == [b"Memcpy HtoD"] and sc.g_stream.tolist() == [9]  # no args.stream: tid
    assert sc.l_corr.tolist() == [5] and sc.l_graph.tolist() == [True]
    assert [m[0] for m in sc.marks] == [b"w.py(3): execute_model"]
    assert np.array_equal(sc.g_corr, [5])
