"""Which captured traces serve-bench attributes, and when a trace SGLang writes is complete enough
to take (issue 15, defect 3)."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
from pathlib import Path

from pcieprof.refserver.names import trace_file_name
from pcieprof.serve.profiling import (POLL_S, SETTLE_S, _wait_for_ranks, move_trace,
                                      trace_state)
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


def _slow_gzip_writer(path: Path, pause_s: float) -> threading.Thread:
    """Write a Kineto-like trace straight to its final name as torch's export does for `.gz`
    (gzip.open(path, "wt") on the final name), with a pause half way, as a large trace takes."""
    events = [{"name": f"k{i}", "ph": "X", "ts": i, "dur": 1, "pid": 0, "tid": 0}
              for i in range(20000)]
    text = json.dumps({"traceEvents": events, "deviceProperties": []})

    def write() -> None:
        with gzip.open(path, "wt") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            time.sleep(pause_s)
            f.write(text[len(text) // 2:])

    th = threading.Thread(target=write)
    th.start()
    return th


def test_a_trace_still_being_written_is_not_taken(tmp_path: Path) -> None:
    # the name appears at once and stops changing while torch still compresses into it: waiting
    # for names to be stable for 1 s took (and moved) a truncated gzip
    staging = tmp_path / "staging"
    staging.mkdir()
    prefix = "pcieprof123"
    trace = staging / f"{prefix}-1700000000.5-TP-0-DECODE.trace.json.gz"
    th = _slow_gzip_writer(trace, pause_s=2.5)

    async def wait() -> tuple[dict[int, list[Path]], bytes]:
        load = asyncio.ensure_future(asyncio.sleep(0))
        found, _, _ = await _wait_for_ranks(staging, 1, prefix, 300.0, load)
        return found, trace.read_bytes()  # what a move would have taken at that moment

    try:
        found, taken = asyncio.run(wait())
    finally:
        th.join()
    assert found == {0: [trace]}
    doc = json.loads(gzip.decompress(taken))  # raised EOFError (truncated gzip) before the fix
    assert len(doc["traceEvents"]) == 20000


def test_trace_completeness_by_content(tmp_path: Path) -> None:
    whole = tmp_path / "a.trace.json.gz"
    whole.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    cut = tmp_path / "b.trace.json.gz"
    cut.write_bytes(whole.read_bytes()[:-6])
    plain = tmp_path / "c.trace.json"
    plain.write_text('{"traceEvents": [\n')
    assert [trace_state(p) for p in (whole, cut, plain)] == ["whole", "growing", "growing"]
    plain.write_text('{"traceEvents": []}\n')
    assert trace_state(plain) == "whole"
    # A whole gzip of a cut or empty document (torch compresses what reached its temporary file
    # when the disk filled) will not grow: it is cut, not whole.
    for body in (b'{"traceEvents": [{"ph": "X"', b"", b"\n  \n"):
        bad = tmp_path / "d.trace.json.gz"
        bad.write_bytes(gzip.compress(body))
        assert trace_state(bad) == "cut", body
    spaced = tmp_path / "e.trace.json.gz"
    spaced.write_bytes(gzip.compress(b'{"traceEvents": []}' + b" " * 100_000 + b"\n"))
    assert trace_state(spaced) == "whole"


def test_moving_a_trace_to_another_filesystem_never_shows_a_partial_file(tmp_path: Path) -> None:
    src = tmp_path / "s" / "x-TP-0.trace.json.gz"
    src.parent.mkdir()
    src.write_bytes(gzip.compress(b"{}"))
    dest = tmp_path / "d"
    dest.mkdir()
    target = move_trace(src, dest)
    assert target == dest / src.name and not src.exists()
    assert gzip.decompress(target.read_bytes()) == b"{}"
    assert [p.name for p in dest.iterdir()] == [src.name]  # no temporary left


def test_the_wait_for_traces_ends_once_the_server_has_exited(tmp_path: Path) -> None:
    """Issue 25 pt 10: a server that died (ENOSPC writing its trace) was waited for the whole
    timeout (5 minutes). Now one more look after it is seen gone, then the wait ends."""
    staging = tmp_path / "staging"
    staging.mkdir()
    asked: list[bool] = []

    def alive() -> bool:
        asked.append(False)
        return False

    async def wait() -> tuple[dict[int, list[Path]], list[Path], list[Path]]:
        load = asyncio.ensure_future(asyncio.sleep(0))
        # the outer bound only keeps a broken wait from hanging the suite
        return await asyncio.wait_for(
            _wait_for_ranks(staging, 1, "pcieprof123", 3600.0, load, alive), timeout=600)

    assert asyncio.run(wait()) == ({}, [], [])
    assert len(asked) == 1


def test_a_trace_cut_by_a_full_disk_ends_the_wait_while_the_server_lives(tmp_path: Path) -> None:
    """A server that stays up after its trace write failed (the reference server does: Kineto
    logs "Failed to write to log file!" and torch still gzips what it had) leaves a whole gzip
    of a cut document. It was taken as a trace; it will never grow, so the wait ends once the
    other ranks are whole and names it."""
    staging = tmp_path / "staging"
    staging.mkdir()
    prefix = "pcieprof123"
    good = staging / f"{prefix}-1700000000.5-TP-0-DECODE.trace.json.gz"
    good.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    bad = staging / f"{prefix}-1700000000.5-TP-1-DECODE.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "na'))

    async def wait() -> tuple[dict[int, list[Path]], list[Path], list[Path]]:
        load = asyncio.ensure_future(asyncio.sleep(0))
        return await asyncio.wait_for(
            _wait_for_ranks(staging, 2, prefix, 3600.0, load, lambda: True), timeout=600)

    assert asyncio.run(wait()) == ({0: [good]}, [], [bad])


def test_by_stage_the_wait_is_for_each_ranks_decode_trace(tmp_path: Path) -> None:
    """An EXTEND window that opened first (a prefill right after /start_profile) closes at the
    first decode step: its trace came long before the DECODE one, held still for SETTLE_S and
    ended the wait, so the run was "ok" with a prefill trace only, and decode attribution ran on
    it. The wait now goes on until each rank's DECODE trace is there (taking the EXTEND one too)."""
    staging = tmp_path / "staging"
    staging.mkdir()
    prefix = "pcieprof123"
    extend = staging / f"{prefix}-1700000000.5-TP-0-EXTEND.trace.json.gz"
    extend.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    decode = staging / f"{prefix}-1700000000.5-TP-0-DECODE.trace.json.gz"
    # alive() is asked once per look that did not end the wait; each look sleeps POLL_S, so by
    # look `late` the EXTEND file had held still longer than SETTLE_S (the old wait was over)
    late = int(SETTLE_S / POLL_S) + 2
    looks: list[int] = []

    def alive() -> bool:
        looks.append(1)
        if len(looks) == late:
            decode.write_bytes(gzip.compress(b'{"traceEvents": []}'))
        return True

    async def wait() -> tuple[dict[int, list[Path]], list[Path], list[Path]]:
        load = asyncio.ensure_future(asyncio.sleep(0))
        return await asyncio.wait_for(
            _wait_for_ranks(staging, 1, prefix, 3600.0, load, alive, "DECODE"), timeout=600)

    assert asyncio.run(wait()) == ({0: [decode, extend]}, [], [])
    assert len(looks) > late
