"""The launcher on small stand-in servers: group teardown, readiness, hang and crash detection."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path


from pcieprof.serve.launcher import ServerProcess, free_port
from pcieprof.serve.outcomes import Outcome
from pcieprof.serve.sglang_cmd import ServerCommand


def _script(tmp_path: Path, body: str) -> ServerCommand:
    p = tmp_path / "srv.py"
    p.write_text(textwrap.dedent(body))
    return ServerCommand(argv=[sys.executable, str(p)], env={"PCIEPROF_TEST_VAR": "1"})


def test_stop_kills_the_whole_group_including_children(tmp_path: Path) -> None:
    cmd = _script(tmp_path, """
        import os, subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                for _ in range(2)]
        print("env", os.environ.get("PCIEPROF_TEST_VAR"), "kids", [k.pid for k in kids], flush=True)
        # Ignore SIGTERM, as a stuck server might: the launcher must escalate to SIGKILL.
        import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
    """)
    srv = ServerProcess(cmd, tmp_path / "server-0.log")
    srv.start()
    deadline = time.monotonic() + 30
    while "kids" not in srv.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = [ln for ln in srv.log_text().splitlines() if ln.startswith("env")][0]
    assert line.startswith("env 1")
    kids = [int(x) for x in line.split("[")[1].rstrip("]").split(",")]
    assert os.getpgid(kids[0]) == srv.pid  # children share the server's own group
    srv.stop(grace_s=0.5)
    assert _gone(lambda: os.killpg(srv.pid, 0))
    for k in kids:
        assert _gone(lambda: os.kill(k, 0))


def _gone(probe) -> bool:
    """True once `probe` raises ProcessLookupError (zombies are reaped by init a moment later)."""
    for _ in range(100):
        try:
            probe()
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_ready_crash_and_hang(tmp_path: Path) -> None:
    port = free_port(start=43000)
    ready = _script(tmp_path, f"""
        from http.server import BaseHTTPRequestHandler, HTTPServer
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
            def log_message(self, *a): pass
        print("Uvicorn running", flush=True)
        HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """)
    srv = ServerProcess(ready, tmp_path / "r.log")
    srv.start()
    try:
        assert srv.wait_ready(f"http://127.0.0.1:{port}", deadline_s=30, poll_s=0.1) is None
    finally:
        srv.stop()

    crash = _script(tmp_path, """
        import sys
        print("Load weight begin.", flush=True)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    """)
    srv = ServerProcess(crash, tmp_path / "c.log")
    srv.start()
    c = srv.wait_ready("http://127.0.0.1:9", deadline_s=30, poll_s=0.1)
    srv.stop()
    assert c is not None and c.outcome is Outcome.OOM and c.exit_code == 1

    hang = _script(tmp_path, """
        import time
        print("Capture cuda graph begin.", flush=True)
        time.sleep(600)
    """)
    srv = ServerProcess(hang, tmp_path / "h.log")
    srv.start()
    t = time.monotonic()
    c = srv.wait_ready("http://127.0.0.1:9", deadline_s=60, stall_s=1.5, poll_s=0.1)
    srv.stop()
    assert c is not None and c.outcome is Outcome.HANG and "Capture cuda graph" in c.excerpt
    assert time.monotonic() - t < 30
