"""`attribute --workers N`: no worker outlives pcieprof (issue 25, point 8). Each worker asks
Linux for SIGKILL at its parent's death (prctl PR_SET_PDEATHSIG, read back here with
PR_GET_PDEATHSIG, linux/prctl.h) and leaves Ctrl-C to the parent."""

from __future__ import annotations

import ctypes
import gzip
import signal
import sys
from pathlib import Path

import orjson
import pytest

from pcieprof.analysis.attribution import worker_pool

PR_GET_PDEATHSIG = 2  # linux/prctl.h


def _asked() -> tuple[int, bool]:
    libc = ctypes.CDLL(None, use_errno=True)
    sig = ctypes.c_int(0)
    libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0)
    return sig.value, signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_every_worker_dies_with_its_parent_and_leaves_ctrl_c_to_it() -> None:
    with worker_pool(2) as pool:
        got = [pool.submit(_asked).result(timeout=60) for _ in range(4)]
    assert all(g == (int(signal.SIGKILL), True) for g in got), got


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


_COPIES = 60  # ~460 MB of JSON per file: several seconds of parsing per worker, even alone


@pytest.fixture(scope="module")
def long_traces(tmp_path_factory: pytest.TempPathFactory, samples: Path) -> list[str]:
    """Ranks 0 and 1 of a long real trace: the events HTA's nccl_data trace recorded (ranks of a
    world of 2), written _COPIES times over into one traceEvents array. One JSON document over
    gzip members (one member compressed once and repeated, as bgzip splits a file), so it is
    made in a second and read like any gzipped trace."""
    src = samples / "traces" / "hta_nccl_single_rank" / "nccl_data.json.gz"
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    body = orjson.dumps(doc.pop("traceEvents"))[1:-1]
    member = gzip.compress(body + b",", 1)
    last = gzip.compress(body + b"]}", 1)
    out = tmp_path_factory.mktemp("long_traces")
    files = []
    for rank in (0, 1):
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": rank}
        f = out / f"rank{rank}.trace.json.gz"
        with f.open("wb") as g:
            g.write(gzip.compress(orjson.dumps(doc)[:-1] + b', "traceEvents": [', 1))
            for _ in range(_COPIES - 1):
                g.write(member)
            g.write(last)
        files.append(str(f))
    return files


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_attribute_killed_leaves_no_worker(tmp_path: Path, sig: int, long_traces: list[str]) -> None:
    """Two long real traces, two workers; once both run, `sig` to pcieprof: SIGTERM ends with
    the interrupted line (exit 130), and after either no worker is left."""
    import os
    import subprocess
    import time

    from builders.cli import pcieprof_argv
    files = long_traces
    proc = subprocess.Popen(pcieprof_argv("attribute", *files, "--workers", "2", "--out",
                                          str(tmp_path / "out")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while len(workers) < 2 and proc.poll() is None and time.monotonic() < deadline:
        workers = _children(proc.pid)
        time.sleep(0.2)
    if proc.poll() is not None:
        pytest.skip("the run ended before both workers started")
    time.sleep(0.5)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1].startswith("pcieprof: interrupted"), err
    gone = time.monotonic() + 60
    while any(Path(f"/proc/{w}").exists() and "Z" not in Path(f"/proc/{w}/stat").read_text()
              .rsplit(")", 1)[1].split()[0] for w in workers) and time.monotonic() < gone:
        time.sleep(0.2)
    left = [w for w in workers if Path(f"/proc/{w}").exists()
            and "Z" not in Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1].split()[0]]
    assert not left, f"workers {left} outlived pcieprof"
