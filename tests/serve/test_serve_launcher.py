"""The launcher on small stand-in servers: group teardown, readiness, hang and crash detection."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path


from pcieprof.bundle.serve_search import Outcome
from pcieprof.redact import remember_environ
from pcieprof.serve.launcher import ServerProcess, _copy_redacted
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
    deadline = time.monotonic() + 120  # three Pythons starting on a loaded machine
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
    """True once `probe` raises ProcessLookupError (zombies are reaped by init a moment later;
    on a loaded machine that moment can be long: up to 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            probe()
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _port_printed(srv: ServerProcess) -> int:
    """The port a stand-in server printed as `port N` once it listened. The server binds port 0
    itself: a port picked free here and bound there later can be taken in between (another test
    run on the same machine picked the same one)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for ln in srv.log_text().splitlines():
            if ln.startswith("port "):
                return int(ln.split()[1])
        assert srv.exit_code() is None, srv.log_text()
        time.sleep(0.05)
    raise AssertionError(f"no port printed within 120 s: {srv.log_text()[-2000:]}")


def test_ready_crash_and_hang(tmp_path: Path) -> None:
    ready = _script(tmp_path, """
        from http.server import BaseHTTPRequestHandler, HTTPServer
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
            def log_message(self, *a): pass
        server = HTTPServer(("127.0.0.1", 0), H)
        print("port", server.server_port, flush=True)
        print("Uvicorn running", flush=True)
        server.serve_forever()
    """)
    srv = ServerProcess(ready, tmp_path / "r.log")
    srv.start()
    try:
        port = _port_printed(srv)
        assert srv.wait_ready(f"http://127.0.0.1:{port}", deadline_s=120, poll_s=0.1) is None
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
    c = srv.wait_ready("http://127.0.0.1:9", deadline_s=120, poll_s=0.1)
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
    c = srv.wait_ready("http://127.0.0.1:9", deadline_s=240, stall_s=1.5, poll_s=0.1)
    srv.stop()
    assert c is not None and c.outcome is Outcome.HANG and "Capture cuda graph" in c.excerpt
    # the stall ended the wait, not the deadline; the time only bounds a loaded machine's start
    assert "stall timeout 1.5 s" in c.summary, c.summary
    assert time.monotonic() - t < 120


def test_health_checks_are_not_progress(tmp_path: Path) -> None:
    # A hung server that keeps answering (and logging) health checks, as SGLang does: the
    # stall clock follows the last progress line, not the log's last line.
    cmd = _script(tmp_path, """
        import sys, time
        from http.server import BaseHTTPRequestHandler, HTTPServer
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                print("[t] Health check failed. Server couldn't get a response from detokenizer "
                      "for last 20 seconds.", flush=True)
                self.send_response(503); self.end_headers()
            def log_message(self, fmt, *a):
                print('[t] 127.0.0.1 - "GET /health_generate HTTP/1.1" 503', flush=True)
        server = HTTPServer(("127.0.0.1", 0), H)
        print("port", server.server_port, flush=True)
        print("[t TP0] Load weight begin.", flush=True)
        print("[t TP0] Prefill batch. #new-seq: 1, #new-token: 1", flush=True)
        server.serve_forever()
    """)
    srv = ServerProcess(cmd, tmp_path / "hc.log")
    srv.start()
    try:
        port = _port_printed(srv)
        c = srv.wait_ready(f"http://127.0.0.1:{port}", deadline_s=240, stall_s=2.0, poll_s=0.1)
        waited = time.monotonic() - srv.started_at
    finally:
        srv.stop()
    assert c is not None and c.outcome is Outcome.HANG and "stall timeout 2 s" in c.summary
    assert "Prefill batch" in srv.progress.last_progress
    assert srv.log_text().count("Health check failed") >= 3  # the log never went quiet
    assert waited < 2.0 + 120  # start-up on a loaded machine; the summary says the stall ended it


def test_advancing_progress_keeps_an_attempt_alive_a_redrawn_bar_does_not(tmp_path: Path) -> None:
    # tqdm redraws with carriage returns; a bar that advances is progress, one redrawn at the
    # same count (its elapsed time ticking) is not.
    cmd = _script(tmp_path, """
        import sys, time
        for i in range(1, 9):
            sys.stderr.write(f"\\rCapturing batches (bs={64 >> i} avail_mem=9.00 GB): "
                             f"{i * 12}%| {i}/8 [00:0{i}<00:01, 1.00it/s]")
            sys.stderr.flush(); time.sleep(0.4)
        for k in range(1000):
            sys.stderr.write(f"\\rCapturing batches (bs=0 avail_mem=9.00 GB): 96%| 8/8 "
                             f"[00:{10 + k:02d}<00:00, 1.00it/s]")
            sys.stderr.flush(); time.sleep(0.3)
    """)
    srv = ServerProcess(cmd, tmp_path / "bar.log")
    srv.start()
    try:
        # stall 5 s: far above the 0.4 s between advances even on a loaded machine (with 1.5 s,
        # a process not scheduled for 1.1 s would have ended the wait early); redraws go on 300 s
        c = srv.wait_ready("http://127.0.0.1:9", deadline_s=240, stall_s=5.0, poll_s=0.1)
        waited = time.monotonic() - srv.started_at
    finally:
        srv.stop()
    assert c is not None and c.outcome is Outcome.HANG
    # the stall ended it while the bar was still being redrawn: redraws are not progress
    assert "stall timeout 5 s" in c.summary, c.summary
    assert srv.progress.count == 8 and "8/8" in srv.progress.last_progress
    assert 3.2 + 5.0 <= waited < 3.2 + 5.0 + 120


def test_a_secret_printed_in_two_bursts_is_masked_whole(tmp_path: Path) -> None:
    # Issue 25 point 2: the copier writes an unfinished line once the output pauses; a secret
    # cut by that pause must not go out as a head (and then a tail) in clear.
    secret = "hf_splitSECRET;&)]}42"
    remember_environ({"HF_TOKEN": secret})
    r, w = os.pipe()
    log = tmp_path / "server-0.log"
    with open(log, "ab", buffering=0) as dst:
        pump = threading.Thread(target=_copy_redacted, args=(os.fdopen(r, "rb"), dst),
                                kwargs={"idle_s": 0.02})
        pump.start()
        for burst in ("using token " + secret[:8], secret[8:] + " ok\nexport HF_TOKEN=",
                      "abc,def;ghi\nGET http://u:p@", "ss@host/x\n"):
            os.write(w, burst.encode())
            time.sleep(0.5)  # 25 times the pause after which an unfinished line is written
        os.close(w)
        pump.join(timeout=30)
    text = log.read_text()
    assert text == "using token *** ok\nexport HF_TOKEN=***\nGET http://***@host/x\n", text
