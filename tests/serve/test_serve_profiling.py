"""Which captured traces serve-bench attributes."""

from __future__ import annotations

from pathlib import Path

from pcieprof.refserver.names import trace_file_name
from pcieprof.serve.run import decode_traces


def test_by_stage_traces_attribute_the_decode_file_of_each_rank() -> None:
    # profile_by_stage gives one file per rank and stage when a prefill falls in the window;
    # attribution needs one file per rank (two for a rank is refused as a duplicate).
    names = [trace_file_name("1.5", r, stage) for r in (0, 1) for stage in ("EXTEND", "DECODE")]
    picked = decode_traces([Path(n) for n in names])
    assert [p.name for p in picked] == [trace_file_name("1.5", r, "DECODE") for r in (0, 1)]


def test_without_stages_every_trace_is_attributed() -> None:
    names = [Path(trace_file_name("1.5", r)) for r in (0, 1)]
    assert decode_traces(names) == names
