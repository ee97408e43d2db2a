"""serve-bench as a hostile user or a broken server would have it (issue 13): secrets planted in
every way they arrive never reach a file of the bundle or the output; bad option values end in
one line and exit 2 before anything is launched; a server that drips bytes, answers garbage or
cuts its answer short ends the run within its deadline (exit 4, one printable line); a run whose
requests all failed is not "ok"; SIGKILL of serve-bench leaves none of its server's processes
behind, and the bundle then reads as interrupted.

The servers are real: the reference server (`--model tiny-cpu`) and, for broken HTTP, a small
socket server in a thread of this test, on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
from builders.cli import cli, pcieprof_argv
from builders.procs import alive, descendants

from pcieprof.bundle import Bundle
from pcieprof.serve import run
from pcieprof.serve.profiling import trace_rank

pytest.importorskip("pcieprof.refserver.server")

LIGHT = ["--num-requests", "2", "--warmup", "0", "--input-len", "8", "--output-len", "4",
         "--concurrency", "1", "--decode-batches", "none", "--no-profile",
         "--probe-tokens", "4"]

# One distinct secret per way in, so that a leak names its way.
SECRETS = {"env_hf": "hfsecret1111", "env_key": "keysecret2222", "argv": "sk-argsecret3333",
           "url": "urlsecret4444", "parent": "parentsecret5555"}


def _cli(args: list[str], timeout: float = 120, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[bytes]:
    """`pcieprof *args` as a process, its output as bytes (builders.cli decodes it, and what a
    broken server sends must be checked byte for byte)."""
    return subprocess.run(pcieprof_argv(*args), capture_output=True,
                          timeout=timeout, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL)


def _leaks(where: Path | None, *outputs: bytes) -> list[str]:
    """`kind@place` for every planted secret found in the files under `where` or the outputs."""
    found = []
    blobs: list[tuple[str, bytes]] = [(f"output{i}", o) for i, o in enumerate(outputs)]
    if where is not None:
        blobs += [(str(f.relative_to(where)), f.read_bytes()) for f in sorted(where.rglob("*"))
                  if f.is_file()]
    for place, data in blobs:
        for kind, secret in SECRETS.items():
            if secret.encode() in data:
                found.append(f"{kind}@{place}")
    return found


# -- option values: exit 2, one line, nothing launched ---------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--dry-run", "--concurrency", "0,-1"], "--concurrency"),
    (["--dry-run", "--request-rate", "-1"], "--request-rate"),
    (["--inject", "nan-after lots"], "--inject"),
    (["--port", "70000"], "--port"),
    (["--input-len", "100000"], "context"),
    (["--warmup", "-1"], "--warmup"),
])
def test_bad_values_exit_2_before_any_launch(tmp_path: Path, args: list[str], words: str) -> None:
    out = tmp_path / "b"
    t0 = time.monotonic()
    p = _cli(["serve-bench", "--model", "tiny-cpu", "--tp", "1", "--out", str(out), *args],
             timeout=120)
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err
    assert not out.exists()  # nothing was started, so no bundle either
    assert time.monotonic() - t0 < 90  # start-up of pcieprof alone, on a loaded machine


def test_dry_run_prints_no_secret(tmp_path: Path) -> None:
    p = _cli(["serve-bench", "--model", "tiny-cpu", "--dry-run",
              "--env", f"HF_TOKEN={SECRETS['env_hf']}", "--env", f"MY_API_KEY={SECRETS['env_key']}",
              "--", "--api-key", SECRETS["argv"]],
             env={"SGLANG_API_KEY": SECRETS["parent"]})
    assert p.returncode == 0, p.stderr.decode()
    assert not _leaks(None, p.stdout, p.stderr), p.stdout.decode()
    out = p.stdout.decode()
    # the command is still all there, with the secrets' places shown
    assert "export HF_TOKEN='***'" in out and "--api-key '***'" in out
    assert "# inherited: SGLANG_API_KEY=***" in out


# -- a real launch: nothing of a secret in the bundle, the report or the output ----------------


def test_secrets_never_reach_bundle_report_or_output(tmp_path: Path) -> None:
    out = tmp_path / "b"
    env = {"SGLANG_API_KEY": SECRETS["parent"]}
    p = _cli(["serve-bench", "--model", "tiny-cpu", "--tp", "1", "--out", str(out), *LIGHT,
              "--env", f"HF_TOKEN={SECRETS['env_hf']}", "--env",
              f"MY_API_KEY={SECRETS['env_key']}", "--debug"], env=env, timeout=240)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert b"bundle (ok)" in p.stdout
    r = _cli(["report", str(out), "-o", str(out / "report.html")], env=env, timeout=240)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert (out / "report.html").stat().st_size > 0
    # the server was given the real values, so they were there to leak
    manifest = json.loads((out / "manifest.json").read_text())
    assert "HF_TOKEN=***" in manifest["argv"], manifest["argv"]
    command = json.loads((out / "serve" / "command.json").read_text())
    assert command["env"]["HF_TOKEN"] == "***" and command["recorded_env"]["SGLANG_API_KEY"] == "***"
    assert not _leaks(out, p.stdout, p.stderr, r.stdout, r.stderr)


def test_secret_after_double_dash_stays_out_of_a_failed_launch(tmp_path: Path) -> None:
    # The reference server refuses --api-key (SGLang's flag, not its own): it prints the
    # argument back in its log, which the bundle keeps, and serve-bench quotes that line.
    out = tmp_path / "b"
    p = _cli(["serve-bench", "--model", "tiny-cpu", "--tp", "1", "--out", str(out), *LIGHT,
              "--", "--api-key", SECRETS["argv"]], timeout=120)
    assert p.returncode == 1, p.stderr.decode()[-2000:]
    log = (out / "serve" / "server-0.log").read_text()
    assert "unrecognized arguments: --api-key ***" in log, log[-1500:]
    assert not _leaks(out, p.stdout, p.stderr)


# -- broken HTTP from --url: bounded, one printable line, exit 4 -----------------------------


class RawServer:
    """A loopback TCP server in a thread that answers every connection with `respond(conn)`."""

    def __init__(self, respond: Callable[[socket.socket, bytes], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.respond = respond
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = conn.recv(65536)
                self.respond(conn, request)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket, bytes], None]], RawServer]]:
    started: list[RawServer] = []

    def start(respond: Callable[[socket.socket, bytes], None]) -> RawServer:
        started.append(RawServer(respond))
        return started[-1]

    yield start
    for s in started:
        s.close()


#: How long the drips go on: far beyond any run that keeps its 2 s deadline, even on a loaded
#: machine, so the time a run took tells the deadline from the drip's end.
DRIP_S = 300


def _drip_after_200(conn: socket.socket, request: bytes) -> None:
    """/health_generate and /get_server_info answer; /generate says 200, then drips for DRIP_S
    (SSE comment lines: bytes that keep a connection busy and carry nothing)."""
    if request.startswith(b"GET /health_generate"):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        return
    if request.startswith(b"GET /get_server_info"):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2"
                     b"\r\nConnection: close\r\n\r\n{}")
        return
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
    for _ in range(DRIP_S * 10):
        conn.sendall(b":\n")
        time.sleep(0.1)


def _drip_health(conn: socket.socket, request: bytes) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    for _ in range(DRIP_S * 10):
        conn.sendall(b" ")
        time.sleep(0.1)


def _garbage(conn: socket.socket, request: bytes) -> None:
    conn.sendall(b"\x1b[31mGARBAGE\x00\xff\xfe not http\x07\r\n\r\n")


def _truncated(conn: socket.socket, request: bytes) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial")


def _attach(port: int, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[bytes], float]:
    t0 = time.monotonic()
    p = _cli(["serve-bench", "--model", "tiny-cpu", "--url",
              f"http://pcieprof:{SECRETS['url']}@127.0.0.1:{port}", "--out", str(out), *LIGHT,
              "--request-timeout", "2", *extra], timeout=DRIP_S - 30)
    return p, time.monotonic() - t0


def _one_printable_error(err: bytes) -> str:
    text = err.decode("utf-8", "replace")
    assert not any(b in err for b in (b"\x1b", b"\x00", b"\x07", b"\xff")), err
    errors = [ln for ln in text.splitlines() if ln.startswith("pcieprof: error:")]
    assert len(errors) == 1 and "Traceback" not in text, text
    return errors[0]


def test_dripping_generate_ends_at_the_deadline(tmp_path: Path, raw_server) -> None:
    s = raw_server(_drip_after_200)
    p, took = _attach(s.port, tmp_path / "b")
    line = _one_printable_error(p.stderr)
    assert p.returncode == 4, line
    assert "all 2 requests of c=1 failed: timeout after 2 s" in line
    assert took < 120  # the 2 s deadline plus start-up on a loaded machine, not the drip's end
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["parts"]["serve"]["status"] == "failed"
    assert "all 2 requests" in manifest["parts"]["serve"]["why"]
    assert not _leaks(tmp_path / "b", p.stdout, p.stderr)


@pytest.mark.parametrize("respond", [_drip_health, _garbage, _truncated],
                         ids=["drip", "garbage", "truncated"])
def test_broken_health_answer_is_one_line_and_exit_4(tmp_path: Path, raw_server,
                                                     respond) -> None:
    s = raw_server(respond)
    p, took = _attach(s.port, tmp_path / "b")
    line = _one_printable_error(p.stderr)
    assert p.returncode == 4 and "is not serving" in line, line
    assert took < 120  # the 2 s deadline plus start-up on a loaded machine, not the drip's end
    assert not _leaks(tmp_path / "b", p.stdout, p.stderr)


# -- success that is not -------------------------------------------------------------------------


def _refuse_generate(conn: socket.socket, request: bytes) -> None:
    """Healthy, but every /generate is refused with SGLang's 400 for a prompt over the context."""
    if request.startswith(b"GET "):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        return
    body = (b'{"error": {"message": "The input (100000 tokens) is longer than the model\'s '
            b'context length (1024 tokens).", "code": 400}}')
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                 + body)


def test_every_request_refused_is_exit_4_not_ok(tmp_path: Path, raw_server) -> None:
    s = raw_server(_refuse_generate)
    out = tmp_path / "b"
    p, _ = _attach(s.port, out, "--input-len", "100000")
    line = _one_printable_error(p.stderr)
    assert p.returncode == 4, line
    assert "bundle (ok)" not in p.stdout.decode()
    manifest = json.loads((out / "manifest.json").read_text())
    why = manifest["parts"]["serve"]["why"]
    assert manifest["parts"]["serve"]["status"] == "failed", manifest["parts"]
    assert why.startswith("all 2 requests of c=1 failed: HTTP 400") and "context length" in why


# -- a port taken between its pick and the server's bind --------------------------------------


def test_a_port_taken_before_the_server_binds_it_is_replaced(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """serve-bench picks a port free at that moment; its server binds it a start-up later. A
    server another run started meanwhile (two serve-bench runs on one machine) took it, and the
    run failed "port_in_use" (seen on the loaded dev machine). The configuration now goes again on
    a port free then; both attempts are recorded (the first one's log says why it failed)."""
    out = tmp_path / "b"
    with socket.socket() as taken:  # the other server: listening on the port handed out first
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        picks = [taken.getsockname()[1]]
        real = run.free_port
        monkeypatch.setattr(run, "free_port",
                            lambda host="127.0.0.1": picks.pop() if picks else real(host))
        r = cli("serve-bench", "--model", "tiny-cpu", "--tp", "1", "--out", str(out), *LIGHT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "was free when checked and taken before the server bound it" in r.stderr
    rows = [json.loads(ln) for ln in (out / "serve" / "attempts.jsonl").read_text().splitlines()]
    assert [a["outcome"] for a in rows] == ["port_in_use", "ok"], rows
    assert rows[0]["config"]["port"] != rows[1]["config"]["port"]
    assert "address already in use" in (out / "serve" / "server-0.log").read_text()


# -- SIGKILL: nothing left behind, the bundle reads as interrupted ------------------------------


def _start_serving(out: Path, tp: int, output: int) -> subprocess.Popen[bytes]:
    """A serve-bench run with a long load, started; returns once its server is ready."""
    bench = subprocess.Popen(
        pcieprof_argv("serve-bench", "--model", "tiny-cpu", "--tp", str(tp), "--out", str(out),
                      *LIGHT, "--num-requests", "100000", "--output-len", "64"),
        stdout=output, stderr=output, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    log = out / "serve" / "server-0.log"
    while not (log.is_file() and "fired up" in log.read_text(errors="replace")):
        if bench.poll() is not None or time.monotonic() > deadline:
            bench.kill()
            bench.wait()
            pytest.fail("the reference server did not get ready")
        time.sleep(0.2)
    return bench


def test_sigkill_of_serve_bench_leaves_no_server_behind(tmp_path: Path) -> None:
    out = tmp_path / "b"
    bench = _start_serving(out, 2, subprocess.DEVNULL)
    tree: set[int] = set()
    try:
        # the pids of this run's tree: serve-bench, the server, its rank
        tree = {bench.pid} | descendants(bench.pid)
        assert len(tree) >= 3, tree
        bench.send_signal(signal.SIGKILL)
        bench.wait(timeout=60)
        # the parent-death signals act at once; 30 s leaves a loaded machine time to deliver
        # them down the tree (serve-bench, server, rank) and to tear the processes down
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and any(alive(p) for p in tree):
            time.sleep(0.05)
        left = [p for p in tree if alive(p)]
        assert not left, f"still alive 30 s after SIGKILL of serve-bench: {left}"
    finally:
        for pid in tree:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            bench.kill()
    manifest = Bundle.open(out).manifest
    assert manifest.status == "interrupted", manifest
    assert manifest.parts["serve"].status == "interrupted"
    assert "ended without closing the bundle" in str(manifest.parts["serve"].why)


def test_sighup_stops_like_sigterm_and_says_where_the_bundle_is(tmp_path: Path) -> None:
    out = tmp_path / "b"
    bench = _start_serving(out, 1, subprocess.PIPE)
    tree: set[int] = set()
    try:
        tree = descendants(bench.pid)
        bench.send_signal(signal.SIGHUP)
        _, err = bench.communicate(timeout=120)  # the server's stop alone may take 10 s + kill
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    text = err.decode()
    assert bench.returncode == 130, text[-2000:]
    assert text.count(f"pcieprof: interrupted; partial bundle: {out}") == 1, text[-2000:]
    assert tree and not any(alive(p) for p in tree)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "partial" and manifest["parts"]["serve"]["status"] == "partial"


# -- the server gone while serve-bench waits for its traces (issue 25, point 10) ---------------


def _freeze_while_profiling(bench: subprocess.Popen[bytes], out: Path) -> set[int]:
    """Stop (SIGSTOP) every process below serve-bench, i.e. the server and its ranks, once the
    server has accepted /start_profile, and check that this moment is one where the server was
    still profiling: no rank has finished its DECODE trace (the one serve-bench waits for; an
    EXTEND one may be there) and serve-bench still waits. Frozen, the server cannot finish a
    trace later, so what the test then does (kill it, or SIGTERM serve-bench) happens at this
    observed moment however slow the machine is. Returns the pids.
    """
    deadline = time.monotonic() + 180
    log = out / "serve" / "server-0.log"
    while not (log.is_file() and '"POST /start_profile HTTP/1.1" 200' in
               log.read_text(errors="replace")):
        if bench.poll() is not None or time.monotonic() > deadline:
            bench.kill()
            pytest.fail("serve-bench did not reach profiling: "
                        + bench.communicate(timeout=60)[1].decode()[-2000:])
        time.sleep(0.05)
    server = descendants(bench.pid)
    for pid in server:
        os.kill(pid, signal.SIGSTOP)
    traces = out / "serve" / "traces"
    written = sorted(p.name for d in (traces, traces / ".incoming") if d.is_dir()
                     for p in d.iterdir() if (trace_rank(p) or (0, "none"))[1] in ("DECODE", None)
                     and not p.name.startswith("."))
    # Steps and a trace export lie between /start_profile's answer and a DECODE trace (with 60
    # decode steps: 2 s of steps and 15 s of export, measured on the loaded 2-core dev box), so
    # this fails only if the test was not scheduled for that long; it then says so instead of
    # checking a run that was never interrupted.
    assert not written and bench.poll() is None, \
        f"the server finished profiling before the test could stop it: {written}, " \
        f"serve-bench exit {bench.poll()}"
    return server


@pytest.mark.parametrize("end", ["server killed", "SIGTERM"])
def test_waiting_for_traces_ends_with_the_server_or_at_sigterm(tmp_path: Path, end: str) -> None:
    """While serve-bench waits for the traces /start_profile asked for: a server that has exited
    (as one that hit ENOSPC writing its trace) ends the wait at once, and the run reports the
    server's exit during profiling (it waited the whole timeout, then said "no complete trace
    within 120 s"); a SIGTERM then ends the run with the interrupted line, exit 130.
    The server is frozen while it profiles (--profile-steps 60 keeps it recording for seconds
    after /start_profile answers), then killed, or serve-bench gets SIGTERM and the server is
    let go on, so the end always comes while the trace is still being recorded."""
    out = tmp_path / "b"
    bench = subprocess.Popen(
        pcieprof_argv("serve-bench", "--model", "tiny-cpu", "--tp", "1", "--out", str(out),
                      *[a for a in LIGHT if a != "--no-profile"], "--profile-steps", "60",
                      "--request-timeout", "120", "--no-attribute"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    server: set[int] = set()
    try:
        server = _freeze_while_profiling(bench, out)
        if end == "SIGTERM":
            bench.send_signal(signal.SIGTERM)
            for pid in server:  # serve-bench stops its server, which must be running to go
                os.kill(pid, signal.SIGCONT)
        else:
            for pid in server:
                os.kill(pid, signal.SIGKILL)
        _, err = bench.communicate(timeout=100)  # under the 120 s the wait had
    finally:
        for pid in server:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    text = err.decode()
    last = text.strip().splitlines()[-1]
    if end == "SIGTERM":
        assert bench.returncode == 130 and last == f"pcieprof: interrupted; partial bundle: {out}", \
            text[-2000:]
        return
    assert "(during profiling)" in last and "internal error" not in text, text[-2000:]
    index = json.loads((out / "serve" / "traces" / "index.json").read_text())
    assert index["status"] == "failed", index
    assert index["why"] == "no complete DECODE trace from rank(s) [0] before the server exited", \
        index
