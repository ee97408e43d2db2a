"""The streaming reader: gzip or plain, rank from distributedInfo (before or after traceEvents) or
the file name, and one-line BadInput for malformed, truncated and non-Kineto files."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterator
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
    a = attribute_traces([samples / SAMPLE], workers=1).ranks[0].totals
    b = attribute_traces([plain], workers=1).ranks[0].totals
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


def _zero_blocks(n: int) -> Iterator[bytes]:
    from pcieprof.analysis.trace_stream import _BLOCK
    for _ in range(n):
        yield bytes(_BLOCK)


def test_no_trace_events_key_is_refused_after_64_mb_read() -> None:
    """Issue 25 pt 9: the key is looked for in each new block only, and no further than 64 MB
    in (the stream is bounded here so that a reader without that cap ends too)."""
    from pcieprof.analysis.trace_stream import _BLOCK, _KEY_WITHIN, _Builder, _NotTrace, _read_blocks
    meta: dict = {}
    with pytest.raises(_NotTrace, match='no "traceEvents" in the first 64 MB'):
        _read_blocks(_zero_blocks(_KEY_WITHIN // _BLOCK + 8), _Builder(Classifier()), meta, True)
    assert meta["_bytes"] <= _KEY_WITHIN + _BLOCK


@pytest.mark.parametrize("size", [1, 3, 7, 13, 4096])
@pytest.mark.parametrize("fast", [True, False])
def test_the_key_is_found_wherever_a_block_ends(size: int, fast: bool) -> None:
    """Blocks that end inside the key's name, its blanks or its colon still find it once."""
    from pcieprof.analysis.trace_stream import _Builder, _read_blocks
    events = [_kernel(0, 10, "gemm_kernel"), _kernel(20, 5, "gemm_kernel", corr=2)]
    text = ('{"schemaVersion": 1, "traceEvents"  :\n  %s, "distributedInfo": {"rank": 3}}'
            % json.dumps(events)).encode()
    b, meta = _Builder(Classifier()), {}
    assert _read_blocks([text[i:i + size] for i in range(0, len(text), size)], b, meta, fast)
    assert (b.n_gpu, meta["schemaVersion"], meta["distributedInfo"]) == (2, 1, {"rank": 3})


def test_two_gb_of_gzipped_zeros_is_one_line_exit_2(tmp_path: Path) -> None:
    """Issue 25 pt 9: 2 GB of zeros (gzip members of 1 MB each) ended exit 2 only after reading
    it all, rescanning the whole text per block (a 200 MB one took 54 s, 2 GB never ended)."""
    from builders.cli import cli
    f = tmp_path / "rank0.trace.json.gz"
    f.write_bytes(gzip.compress(bytes(1 << 20), 1) * 2048)
    r = cli("attribute", str(f), "--out", str(tmp_path / "b"), "-q", process=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert 'no "traceEvents" in the first 64 MB' in r.stderr, r.stderr


@pytest.mark.parametrize("reader", ["scan", "chunked", "ijson"])
def test_a_gzip_holding_one_trace_twice_is_refused(tmp_path: Path, samples: Path,
                                                   monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """Issue 25 pt 11: two gzip members, each a whole trace (`cat a.gz a.gz`), were read as one
    trace with twice the events."""
    from pcieprof.analysis import trace_stream
    monkeypatch.setattr(trace_stream, "READER", reader)
    p = tmp_path / "rank1.trace.json.gz"
    p.write_bytes((samples / SAMPLE).read_bytes() * 2)
    with pytest.raises(BadInput, match=r"more than one JSON document \(concatenated traces\?\)") as e:
        read_trace(p, Classifier())
    assert "\n" not in e.value.one_line()


def test_data_after_the_document_is_refused(tmp_path: Path) -> None:
    text = json.dumps({"traceEvents": [_kernel(0, 10, "gemm_kernel")]}) + '\n{"traceName": "x"}\n'
    with pytest.raises(BadInput, match="more than one JSON document"):
        read_trace(_write(tmp_path / "t.json", text), Classifier())


def test_one_document_over_many_gzip_members_reads_as_one(tmp_path: Path, samples: Path) -> None:
    """bgzip and pigz -i write one document over many members (64 KB each, cut anywhere):
    the same numbers as the single-member file."""
    text = gzip.decompress((samples / SAMPLE).read_bytes())
    p = tmp_path / "rank1.trace.json.gz"
    p.write_bytes(b"".join(gzip.compress(text[i:i + 65280], 1) for i in range(0, len(text), 65280)))
    a = attribute_traces([samples / SAMPLE], workers=1).ranks[0].totals
    assert attribute_traces([p], workers=1).ranks[0].totals == a


def test_a_doubled_trace_is_one_line_exit_2(tmp_path: Path, samples: Path) -> None:
    from builders.cli import cli
    p = tmp_path / "rank1.trace.json.gz"
    p.write_bytes((samples / SAMPLE).read_bytes() * 2)
    r = cli("attribute", str(p), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "more than one JSON document" in r.stderr, r.stderr
