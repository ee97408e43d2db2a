"""A profiler trace given to `pcieprof import` (the traces of ../shared/samples/traces are
`pcieprof attribute` inputs): one line that says where it goes, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders.cli import cli


def test_gzipped_trace_points_to_attribute(samples: Path, tmp_path: Path) -> None:
    traces = sorted((samples / "traces").rglob("*.json.gz"))
    if not traces:
        pytest.skip("no traces in ../shared/samples/traces")
    for trace in traces:
        r = cli("import", str(trace), "--out", str(tmp_path / trace.name))
        assert r.returncode == 2, trace
        (line,) = r.stderr.strip().splitlines()
        assert str(trace) in line and "gzip" in line and "pcieprof attribute" in line
