"""`attribute --workers N`: no worker outlives pcieprof (issue 25, point 8). Each worker asks
Linux for SIGKILL at its parent's death (prctl PR_SET_PDEATHSIG, read back here with
PR_GET_PDEATHSIG, linux/prctl.h) and leaves Ctrl-C to the parent."""

from __future__ import annotations

import ctypes
import signal
import sys

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
    from pathlib import Path
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_attribute_killed_leaves_no_worker(tmp_path: "Path", sig: int) -> None:
    """Two slow inputs (200 MB of zeros each, gzipped: the parser reads them for long), two
    workers; once both run, `sig` to pcieprof: SIGTERM ends with the interrupted line (exit
    130), and after either no worker is left."""
    import gzip
    import os
    import subprocess
    import time
    from pathlib import Path

    from builders.cli import pcieprof_argv
    files = []
    for i in range(2):
        f = tmp_path / f"rank{i}.trace.json.gz"
        with gzip.open(f, "wb", compresslevel=1) as g:
            for _ in range(200):
                g.write(bytes(1 << 20))
        files.append(str(f))
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
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1].startswith("pcieprof: interrupted"), err
    gone = time.monotonic() + 30
    while any(Path(f"/proc/{w}").exists() and "Z" not in Path(f"/proc/{w}/stat").read_text()
              .rsplit(")", 1)[1].split()[0] for w in workers) and time.monotonic() < gone:
        time.sleep(0.2)
    left = [w for w in workers if Path(f"/proc/{w}").exists()
            and "Z" not in Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1].split()[0]]
    assert not left, f"workers {left} outlived pcieprof"
