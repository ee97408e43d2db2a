"""Injected faults: each dies (or hangs) the way SGLang does, says so in the log, leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request

READY = "The server is fired up and ready to roll!"
NAN_TEXT = "probability tensor contains either `inf`, `nan` or element < 0"
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


def _stream_tokens(url: str, n: int, timeout: float) -> tuple[int, bool]:
    """Stream a /generate; returns (token events received, whether [DONE] came)."""
    body = json.dumps({"text": "x", "stream": True,
                       "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}).encode()
    req = urllib.request.Request(url + "/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    events, done = 0, False
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    events += 1
                done = done or line.startswith(b"data: [DONE]")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        pass
    return events, done


def test_nan_after_kills_the_server_with_torchs_error(start_server) -> None:
    s = start_server(["--inject", "nan-after 3"])
    s.wait_ready()
    ranks = s.ranks
    events, done = _stream_tokens(s.url, 10, timeout=120)
    assert not done and events == 4  # the prefill token and 3 decode steps, then NaN
    assert s.wait_exit(120) == 1
    log = s.log()
    assert "[pcieprof inject] nan-after 3" in log
    assert "Scheduler hit an exception" in log and NAN_TEXT in log and SIGQUIT in log
    assert s.all_gone(ranks)


def test_hang_stops_progress_and_health_generate_times_out(start_server) -> None:
    s = start_server(["--inject", "hang"], env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    s.wait_ready()
    t0 = time.perf_counter()
    try:
        urllib.request.urlopen(s.url + "/health_generate", timeout=120)
        status = 200
    except urllib.error.HTTPError as exc:
        status = exc.code
    waited = time.perf_counter() - t0
    # 503 after the 1 s health timeout; hung, it would not answer at all (then urlopen raises)
    assert status == 503 and 0.9 < waited < 60, waited
    events, done = _stream_tokens(s.url, 3, timeout=1.5)
    assert events == 0 and not done
    assert s.proc.poll() is None  # hung, not dead
    assert "[pcieprof inject] hang" in s.log() and "Health check failed" in s.log()
    ranks = s.ranks
    os.killpg(s.proc.pid, signal.SIGTERM)  # a launcher's teardown: a clean stop, even hung
    assert s.wait_exit(120) == 0
    assert s.all_gone(ranks)
    assert SIGQUIT not in s.log() and "Received SIGTERM" in s.log()


def test_crash_on_start_exits_before_ready(start_server) -> None:
    s = start_server(["--inject", "crash-on-start"])
    code = s.wait_exit(180)
    log = s.log()
    assert code == 1, log
    assert READY not in log
    assert "[pcieprof inject] crash-on-start" in log and SIGQUIT in log


def test_port_in_use_is_one_line_and_exit_1(start_server) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        s = start_server(["--port", str(port)], tp=1)  # the later --port wins
        assert s.wait_exit(180) == 1
    assert "address already in use" in s.log()
    assert READY not in s.log()


def test_a_rank_that_crashes_natively_leaves_its_stack_and_signal_in_the_log(start_server) -> None:
    # A SIGSEGV in a worker rank (as a with_stack profiler stop can cause) must be readable in
    # the log: the rank's Python stack (faulthandler) and how it ended, not only rank 0's
    # "Connection reset by peer".
    s = start_server(tp=2)
    s.wait_ready()
    ranks = s.ranks
    assert len(ranks) == 1
    rank = next(iter(ranks))
    # a member of rank 0's group: the launcher's group stop reaches it too
    assert os.getpgid(rank) == s.proc.pid
    os.kill(rank, signal.SIGSEGV)
    assert s.wait_exit(120) == 1
    log = s.log()
    assert "Fatal Python error: Segmentation fault" in log, log[-2000:]
    assert f"{SIGQUIT} (TP1, pid {rank}, killed by signal 11 (SIGSEGV))" in log, log[-2000:]
    assert s.all_gone(ranks)
