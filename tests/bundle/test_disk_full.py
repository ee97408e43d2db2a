"""A full disk, for real (issue 25 point 6): the writes run in a child process under a file size
limit (RLIMIT_FSIZE, with SIGXFSZ ignored), so the kernel itself refuses them (EFBIG) part way,
as it does with ENOSPC on a full file system; nothing in the write path is replaced.

A table torn inside a quoted field loses only its torn row for every reader; `recommend --out`
onto a full disk ends with exit 2 and one line, and the copy reads as partial.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

from builders.bundles import make_bundle
from builders.cli import pcieprof_argv

from pcieprof.bundle import Bundle

#: Rows appended when the disk fills: `detail` is quoted in the CSV (it holds a comma).
ROWS = [{"src": s, "dst": 0, "path": "p2p", "direction": "uni", "size_bytes": 1 << 20,
         "bandwidth_gbps": 20.0 + s, "status": "ok", "detail": "simulated, by the fabric model"}
        for s in (1, 2, 3)]

_APPEND = """
import json, resource, signal, sys
from pcieprof.bundle import Bundle
b = Bundle.open(sys.argv[1])
limit = int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    b.append_rows("p2p", json.loads(sys.argv[3]))
except OSError as exc:
    print(exc.errno)
"""


def _full_at(nbytes: int) -> Callable[[], None]:
    """A preexec_fn: no file of the child may grow past `nbytes` (writes fail with EFBIG)."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return limit


def _torn_bundle(tmp_path: Path) -> tuple[Bundle, int]:
    """A bundle whose p2p.csv a full disk cut inside the quoted `detail` of the third of ROWS;
    and the number of its whole rows."""
    scratch = Bundle.create(tmp_path / "scratch", command="t", source="measured", backend="cpu")
    scratch.append_rows("p2p", ROWS)
    text = (scratch.path / "p2p.csv").read_bytes()
    rows_text = text[text.index(b"\n") + 1:]
    third = rows_text.index(b"\n", rows_text.index(b"\n") + 1) + 1
    cut_in_row = rows_text.index(b'"simula', third) + len(b'"sim')

    b = make_bundle(tmp_path / "torn")
    whole = len(b.read_table("p2p"))
    size = (b.path / "p2p.csv").stat().st_size
    r = subprocess.run([sys.executable, "-c", _APPEND, str(b.path), str(size + cut_in_row),
                        json.dumps(ROWS)], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "27", r.stderr  # EFBIG: the kernel refused the write
    data = (b.path / "p2p.csv").read_bytes()
    assert data.endswith(b',ok,"sim'), data[-80:]  # torn inside the quoted field
    return Bundle.open(b.path), whole + 2


def test_a_table_torn_inside_a_quoted_field_loses_only_that_row(tmp_path: Path) -> None:
    b, whole = _torn_bundle(tmp_path)
    df = b.read_table("p2p")
    assert len(df) == whole
    assert list(df["detail"].iloc[-2:]) == ["simulated, by the fabric model"] * 2
    other = make_bundle(tmp_path / "other").path
    for args in (["report", str(b.path), "-o", str(tmp_path / "r.html")],
                 ["recommend", str(b.path), "--out", str(tmp_path / "copy"), "--no-layouts"],
                 ["compare", str(other), str(b.path)]):
        r = subprocess.run(pcieprof_argv(*args), capture_output=True, text=True, timeout=300)
        assert r.returncode in (0, 1), (args, r.stderr[-2000:])  # compare: 1 = a regression
        assert "unreadable" not in r.stderr and "error" not in r.stderr, r.stderr
        assert "cut short" in r.stderr  # the reader says a row was left out


def test_recommend_out_onto_a_full_disk_is_exit_2_one_line_and_partial(tmp_path: Path) -> None:
    src = make_bundle(tmp_path / "src").path
    dst = tmp_path / "dst"
    limit = (src / "manifest.json").stat().st_size * 4  # the manifest fits, p2p.csv does not
    assert (src / "p2p.csv").stat().st_size > limit
    r = subprocess.run(pcieprof_argv("recommend", str(src), "--out", str(dst), "--no-layouts"),
                       capture_output=True, text=True, timeout=300, preexec_fn=_full_at(limit))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 400, r.stderr
    assert "File too large" in lines[0] or "No space" in lines[0]
    copy = Bundle.open(dst)
    assert copy.manifest.status == "partial" and "cut short" in copy.manifest.why
    assert Bundle.open(src).manifest.status == "ok"  # the original untouched


def test_a_whole_last_row_without_a_line_break_is_kept(tmp_path: Path) -> None:
    # a hand-written table may end without a line break; a row with every field is whole
    b = Bundle.create(tmp_path / "b", command="t", source="measured", backend="cpu")
    b.append_rows("p2p", ROWS[:2])
    p = b.path / "p2p.csv"
    p.write_bytes(p.read_bytes().rstrip(b"\r\n"))
    assert len(b.read_table("p2p")) == 2
    p.write_bytes(p.read_bytes()[:-5])  # but not one cut inside its quoted field
    assert len(b.read_table("p2p")) == 1
