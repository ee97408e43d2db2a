"""The streaming reader: gzip or plain, rank from distributedInfo (before or after traceEvents) or
the file name, and one-line BadInput for malformed, truncated and non-Kineto files."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from pcieprof.analysis.attribution import attribute_traces
from pcieprof.analysis.classify import Classifier
from pcieprof.analysis.trace_stream import rank_from_name, read_trace
from pcieprof.errors import BadInput

SAMPLE = "traces/hta_trace_filter_2rank/sampled_rank-1.json.gz"


def _kernel(ts: float, dur: float, name: str, stream: int = 7, corr: int = 1) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": corr, "device": 0}}


def _write(path: Path, doc_text: str) -> Path:
    path.write_text(doc_text, encoding="utf-8")
    return path


def test_distributed_info_after_trace_events_and_plain_json(tmp_path: Path) -> None:
    events = [_kernel(0, 10, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 20),
              _kernel(5, 10, "gemm_kernel")]
    text = '{"traceEvents": %s, "distributedInfo": {"rank": 5, "world_size": 8}}' % json.dumps(events)
    rt = read_trace(_write(tmp_path / "whatever.json", text), Classifier())
    assert (rt.rank, rt.rank_source) == (5, "distributedInfo")
    assert rt.g_ts.size == 2


def test_rank_from_sglang_file_name(tmp_path: Path, samples: Path) -> None:
    assert rank_from_name(Path("1733-TP-3-DECODE.trace.json.gz")) == 3
    assert rank_from_name(Path("sampled_rank-1.json.gz")) == 1
    events = [_kernel(0, 10, "gemm_kernel")]
    p = _write(tmp_path / "1733-TP-6.trace.json", json.dumps({"traceEvents": events}))
    rt = read_trace(p, Classifier())
    assert (rt.rank, rt.rank_source) == (6, "file name")


def test_gzip_and_plain_give_the_same_numbers(tmp_path: Path, samples: Path) -> None:
    plain = tmp_path / "r.json"
    with gzip.open(samples / SAMPLE, "rb") as f, plain.open("wb") as g:
        shutil.copyfileobj(f, g)
    a = attribute_traces([samples / SAMPLE], workers=1)["ranks"][0]["totals"]
    b = attribute_traces([plain], workers=1)["ranks"][0]["totals"]
    assert a == b


@pytest.mark.parametrize("content, needle", [
    ('{"foo": [1, 2, 3]}', "not a Kineto trace"),
    ("this is not json", "malformed"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur"', "truncated"),
    ('{"traceEvents": [{"ph": "M", "name": "process_name"}]}', "without GPU kernels"),
])
def test_bad_files_are_one_line_bad_input(tmp_path: Path, content: str, needle: str) -> None:
    p = _write(tmp_path / "t.json", content)
    with pytest.raises(BadInput) as e:
        attribute_traces([p], workers=1)
    assert needle in e.value.one_line() and "\n" not in e.value.one_line()


def test_truncated_gzip_is_bad_input(tmp_path: Path, samples: Path) -> None:
    data = (samples / SAMPLE).read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput, match="truncated"):
        attribute_traces([p], workers=1)


def test_duplicate_ranks_and_missing_files(tmp_path: Path, samples: Path) -> None:
    with pytest.raises(BadInput, match="both claim rank 1"):
        attribute_traces([samples / SAMPLE, samples / SAMPLE], workers=1)
    with pytest.raises(BadInput, match="no such trace file"):
        attribute_traces([tmp_path / "nope.json"])
    with pytest.raises(BadInput, match="no trace files"):
        attribute_traces([])
